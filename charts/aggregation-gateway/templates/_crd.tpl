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
      # The built-in API prints SERVICE as namespace/name or Local and AVAILABLE as True or
      # "False (Reason)": joined cells, where a CRD's printer column is one JSON path. So these
      # print the parts, with the namespace and the reason at priority 1 (shown by -o wide), and
      # the gateway joins them into the built-in API's four columns when kubectl asks through it.
      # The names are what the gateway looks for: change them together with handlers/apiservice_printing.rs.
      additionalPrinterColumns:
        - name: Service
          type: string
          description: The name of the Service that hosts this API endpoint; empty for a group the core serves itself (Local).
          jsonPath: .spec.service.name
        - name: Available
          type: string
          description: Whether this service is available.
          jsonPath: .status.conditions[?(@.type=="Available")].status
        - name: Age
          type: date
          jsonPath: .metadata.creationTimestamp
        - name: Service Namespace
          type: string
          priority: 1
          description: The namespace of the Service that hosts this API endpoint.
          jsonPath: .spec.service.namespace
        - name: Reason
          type: string
          priority: 1
          description: Why the Available condition is what it is.
          jsonPath: .status.conditions[?(@.type=="Available")].reason
      schema:
        openAPIV3Schema:
          description: APIService represents a server for a particular GroupVersion; the gateway routes /apis/<group>/<version> to it.
          type: object
          required:
            - spec
          # kube-aggregator's ValidateAPIService (k8s.io/kube-aggregator pkg/apis/apiregistration/
          # validation) as CEL rules, each with its field and its words, so `kubectl apply` of a
          # bad APIService gets the 422 the built-in API gives. Only the printed value differs: a
          # CEL error shows the type ("object") where kube shows the value.
          x-kubernetes-validations:
            - rule: "self.metadata.name == (has(self.spec.version) ? self.spec.version : '') + '.' + (has(self.spec.group) ? self.spec.group : '')"
              fieldPath: .metadata.name
              messageExpression: "'must be `spec.version+\".\"+spec.group`: \"' + (has(self.spec.version) ? self.spec.version : '') + '.' + (has(self.spec.group) ? self.spec.group : '') + '\"'"
          properties:
            apiVersion:
              type: string
            kind:
              type: string
            metadata:
              type: object
              properties:
                name:
                  type: string
            spec:
              description: What the gateway needs to route to and verify the backend.
              type: object
              x-kubernetes-validations:
                - rule: "(has(self.group) && self.group != '') || (has(self.version) && self.version == 'v1')"
                  fieldPath: .group
                  reason: FieldValueRequired
                  message: only v1 may have an empty group and it better be legacy kube
                - rule: "!has(self.group) || self.group == '' || self.group.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$')"
                  fieldPath: .group
                  message: "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
                - rule: "has(self.version) && self.version.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')"
                  fieldPath: .version
                  message: "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')"
                - rule: "has(self.groupPriorityMinimum) && self.groupPriorityMinimum > 0 && self.groupPriorityMinimum <= 20000"
                  fieldPath: .groupPriorityMinimum
                  message: must be positive and less than 20000
                - rule: "has(self.versionPriority) && self.versionPriority > 0 && self.versionPriority <= 1000"
                  fieldPath: .versionPriority
                  message: must be positive and less than 1000
                - rule: "has(self.service) || !has(self.caBundle) || size(self.caBundle) == 0"
                  fieldPath: .caBundle
                  message: local APIServices may not have a caBundle
                - rule: "has(self.service) || !has(self.insecureSkipTLSVerify) || !self.insecureSkipTLSVerify"
                  fieldPath: .insecureSkipTLSVerify
                  message: local APIServices may not have insecureSkipTLSVerify
                - rule: "!has(self.service) || !has(self.insecureSkipTLSVerify) || !self.insecureSkipTLSVerify || !has(self.caBundle) || size(self.caBundle) == 0"
                  fieldPath: .insecureSkipTLSVerify
                  message: may not be true if caBundle is present
              properties:
                group:
                  description: The API group name this server hosts.
                  type: string
                  # Bounds the cost of the CEL rules above (kube: "must be no more than 253 characters").
                  maxLength: 253
                version:
                  description: The API version this server hosts, e.g. v1.
                  type: string
                  maxLength: 63
                groupPriorityMinimum:
                  description: Priority of this group in discovery (higher first); at least this group's priority.
                  type: integer
                  format: int32
                versionPriority:
                  description: Ordering of this version within its group (higher first).
                  type: integer
                  format: int32
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
                  required:
                    - namespace
                    - name
                  x-kubernetes-validations:
                    - rule: "self.namespace != ''"
                      fieldPath: .namespace
                      reason: FieldValueRequired
                      message: must not be empty
                    - rule: "self.name != ''"
                      fieldPath: .name
                      reason: FieldValueRequired
                      message: must not be empty
                    - rule: "self.port >= 1 && self.port <= 65535"
                      fieldPath: .port
                      message: "port is not valid: must be between 1 and 65535, inclusive"
                  properties:
                    namespace:
                      type: string
                    name:
                      type: string
                    port:
                      description: Service port (default 443).
                      type: integer
                      format: int32
                      default: 443
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
