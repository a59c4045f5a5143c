{{/*
The APIService CustomResourceDefinition, for core servers that serve CRDs but not
apiregistration.k8s.io themselves. It mirrors the built-in apiregistration.k8s.io/v1 type. Groups
ending in k8s.io need the api-approved.kubernetes.io annotation; "unapproved, ..." is the documented
value for such a mirror.

It is never an object of the release: Helm installs into the cluster it talks to, whose
kube-apiserver has APIService built in (a CRD of the same group and resource would collide with it),
while the core that needs the CRD is a sidecar or an external server Helm never reaches. So
core-manifests.yaml renders it into the <fullname>-core ConfigMap, to be applied to the core.
*/}}
{{- define "aggregation-gateway.apiServiceCRD" -}}
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: apiservices.apiregistration.k8s.io
  labels:
    {{- include "aggregation-gateway.coreLabels" . | nindent 4 }}
  annotations:
    api-approved.kubernetes.io: "unapproved, mirrors the built-in apiregistration.k8s.io/v1 APIService for servers that lack it"
spec:
  group: apiregistration.k8s.io
  scope: Cluster
  names:
    kind: APIService
    listKind: APIServiceList
    plural: apiservices
    singular: apiservice
    categories:
      - api-extensions
  versions:
    - name: v1
      served: true
      storage: true
      subresources:
        status: {}
      additionalPrinterColumns:
        - name: Service
          type: string
          description: The Service (namespace/name) serving this group version; empty for a group the core serves itself.
          jsonPath: .spec.service.name
        - name: Available
          type: string
          description: Whether the gateway can reach the APIService's backend.
          jsonPath: .status.conditions[?(@.type=="Available")].status
        - name: Age
          type: date
          jsonPath: .metadata.creationTimestamp
      schema:
        openAPIV3Schema:
          description: APIService represents a server for a particular GroupVersion; the gateway routes /apis/<group>/<version> to it.
          type: object
          properties:
            apiVersion:
              type: string
            kind:
              type: string
            metadata:
              type: object
            spec:
              description: What the gateway needs to route to and verify the backend.
              type: object
              required:
                - groupPriorityMinimum
                - versionPriority
              properties:
                group:
                  description: The API group name this server hosts.
                  type: string
                version:
                  description: The API version this server hosts, e.g. v1.
                  type: string
                groupPriorityMinimum:
                  description: Priority of this group in discovery (higher first); at least this group's priority.
                  type: integer
                  format: int32
                  minimum: 1
                  maximum: 20000
                versionPriority:
                  description: Ordering of this version within its group (higher first).
                  type: integer
                  format: int32
                  minimum: 1
                  maximum: 1000
                caBundle:
                  description: PEM bundle (base64 in JSON/YAML) that verifies the backend's serving certificate.
                  type: string
                  format: byte
                insecureSkipTLSVerify:
                  description: Skip verifying the backend's serving certificate. Strongly discouraged.
                  type: boolean
                service:
                  description: The Service in front of the backend; omitted when the core serves the group itself.
                  type: object
                  properties:
                    namespace:
                      type: string
                    name:
                      type: string
                    port:
                      description: Service port (default 443).
                      type: integer
                      format: int32
                      minimum: 1
                      maximum: 65535
            status:
              description: Written by the gateway's availability controller.
              type: object
              properties:
                conditions:
                  type: array
                  x-kubernetes-list-type: map
                  x-kubernetes-list-map-keys:
                    - type
                  items:
                    type: object
                    required:
                      - type
                      - status
                    properties:
                      type:
                        type: string
                      status:
                        type: string
                        enum: ["True", "False", "Unknown"]
                      lastTransitionTime:
                        type: string
                        format: date-time
                      reason:
                        type: string
                      message:
                        type: string
{{- end }}
