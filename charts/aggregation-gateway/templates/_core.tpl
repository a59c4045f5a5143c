{{/*
The user's core server as a container of the gateway's Pod. Context: dict "root" $ "native" bool.
Native sidecar (init container, restartPolicy Always): the kubelet starts it before the gateway and
stops it only after the gateway has exited, so the core outlives the gateway's drain. As an
ordinary container it would get SIGTERM together with the gateway; a preStop sleep as long as the
gateway's shutdown delay + timeout keeps it serving until the gateway is done.
*/}}
{{- define "aggregation-gateway.coreContainer" -}}
{{- $root := .root }}
{{- $s := $root.Values.core.sidecar }}
{{- /* The kubelet sends httpGet, tcpSocket and grpc probes to the Pod IP. A core whose arguments
bind it to loopback can never pass one: a native sidecar would never count as started, the
gateway would never start, and the core would be restarted forever. */}}
{{- $loopback := "" }}
{{- range $s.args }}
{{- if regexMatch `^--(bind-address|address|listen-address|host)=(127\.0\.0\.1|localhost|::1|\[::1\])$` (toString .) }}{{ $loopback = toString . }}{{ end }}
{{- end }}
{{- if $loopback }}
{{- range $probe := list "startupProbe" "livenessProbe" "readinessProbe" }}
{{- range $kind := list "httpGet" "tcpSocket" "grpc" }}
{{- if hasKey (get $s $probe | default dict) $kind }}
{{- fail (printf "core.sidecar.%s.%s: the core listens on loopback (%s) but the kubelet sends %s probes to the Pod IP, so it would never pass; use an exec probe or none (the gateway's readiness check core-server already waits for the core)" $probe $kind $loopback $kind) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
name: {{ $s.name }}
image: {{ printf "%s:%s" $s.image.repository (toString $s.image.tag) }}
imagePullPolicy: {{ $s.image.pullPolicy }}
{{- if .native }}
restartPolicy: Always
{{- end }}
{{- with $s.command }}
command:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $s.args }}
args:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $s.env }}
env:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $s.envFrom }}
envFrom:
  {{- toYaml . | nindent 2 }}
{{- end }}
ports:
  - name: core
    containerPort: {{ $s.port }}
    protocol: TCP
{{- with $s.startupProbe }}
startupProbe:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $s.livenessProbe }}
livenessProbe:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $s.readinessProbe }}
readinessProbe:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- if not .native }}
lifecycle:
  preStop:
    sleep:
      seconds: {{ sub (include "aggregation-gateway.terminationGracePeriodSeconds" $root | int) 5 }}
{{- end }}
{{- with $s.resources }}
resources:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $s.securityContext }}
securityContext:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $s.volumeMounts }}
volumeMounts:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/*
The manifests meant for the core server, as a YAML map of ConfigMap key to manifest text ("" when
there are none); see core-manifests.yaml. Also validates crd.create and rbac.coreSubjects.
*/}}
{{- define "aggregation-gateway.coreManifests" -}}
{{- $root := . }}
{{- $thisCluster := include "aggregation-gateway.coreIsThisCluster" . }}
{{- $kube := eq .Values.apiServices.source "kube" }}
{{- $data := dict }}
{{- if .Values.crd.create }}
{{- if not $kube }}
{{- fail (printf "crd.create needs apiServices.source kube: the CRD stores the APIService objects the gateway watches on the core, and with source %s nothing reads them" .Values.apiServices.source) }}
{{- end }}
{{- if $thisCluster }}
{{- fail (printf "crd.create: the core (%s) is this cluster's kube-apiserver, which serves APIService itself; the CRD is for a core server that lacks apiregistration.k8s.io" .Values.core.url) }}
{{- end }}
{{- $_ := set $data "apiservice-crd.yaml" (include "aggregation-gateway.apiServiceCRD" .) }}
{{- end }}
{{- if and .Values.rbac.create (not (include "aggregation-gateway.useServiceAccountToken" .)) }}
{{- with include "aggregation-gateway.rbacRules" . }}
{{- $rbac := list (dict
  "apiVersion" "rbac.authorization.k8s.io/v1"
  "kind" "ClusterRole"
  "metadata" (dict "name" (include "aggregation-gateway.fullname" $root) "labels" (include "aggregation-gateway.coreLabels" $root | fromYaml))
  "rules" (printf "rules:\n%s" . | fromYaml).rules) }}
{{- $subjects := list }}
{{- range $root.Values.rbac.coreSubjects }}
{{- $s := deepCopy . }}
{{- if and (has .kind (list "User" "Group")) (not .apiGroup) }}{{ $_ := set $s "apiGroup" "rbac.authorization.k8s.io" }}{{ end }}
{{- if and (eq .kind "ServiceAccount") (not .namespace) }}
{{- fail (printf "rbac.coreSubjects: ServiceAccount %s needs a namespace (the core's namespace of that ServiceAccount)" .name) }}
{{- end }}
{{- $subjects = append $subjects $s }}
{{- end }}
{{- if $subjects }}
{{- $rbac = append $rbac (dict
  "apiVersion" "rbac.authorization.k8s.io/v1"
  "kind" "ClusterRoleBinding"
  "metadata" (dict "name" (include "aggregation-gateway.fullname" $root) "labels" (include "aggregation-gateway.coreLabels" $root | fromYaml))
  "roleRef" (dict "apiGroup" "rbac.authorization.k8s.io" "kind" "ClusterRole" "name" (include "aggregation-gateway.fullname" $root))
  "subjects" $subjects) }}
{{- end }}
{{- /* The authentication ConfigMap's Role in kube-system on the core, as in this cluster for the
ServiceAccount (rbac-authentication.yaml). */}}
{{- if include "aggregation-gateway.managesAuthenticationConfigMap" $root }}
{{- $role := include "aggregation-gateway.authenticationRole" (dict "root" $root "labels" "aggregation-gateway.coreLabels") | fromYaml }}
{{- $rbac = append $rbac $role }}
{{- if $subjects }}
{{- $rbac = append $rbac (dict
  "apiVersion" "rbac.authorization.k8s.io/v1"
  "kind" "RoleBinding"
  "metadata" (dict "name" $role.metadata.name "namespace" $role.metadata.namespace "labels" (include "aggregation-gateway.coreLabels" $root | fromYaml))
  "roleRef" (dict "apiGroup" "rbac.authorization.k8s.io" "kind" "Role" "name" $role.metadata.name)
  "subjects" $subjects) }}
{{- end }}
{{- end }}
{{- /* The leader-election Lease's Role, in the Lease's namespace on the core. A fresh core has
only its built-in namespaces: the Lease's (by default the release namespace, which exists in this
cluster, not on the core) comes first, or the Role and the Lease cannot be created. */}}
{{- if include "aggregation-gateway.leaderElection" $root }}
{{- $leaseNamespace := include "aggregation-gateway.leaseNamespace" $root }}
{{- if not (has $leaseNamespace (list "default" "kube-system" "kube-public" "kube-node-lease")) }}
{{- $rbac = append $rbac (dict
  "apiVersion" "v1"
  "kind" "Namespace"
  "metadata" (dict "name" $leaseNamespace "labels" (include "aggregation-gateway.coreLabels" $root | fromYaml))) }}
{{- end }}
{{- $role := include "aggregation-gateway.leaderElectionRole" (dict "root" $root "labels" "aggregation-gateway.coreLabels") | fromYaml }}
{{- $rbac = append $rbac $role }}
{{- if $subjects }}
{{- $rbac = append $rbac (dict
  "apiVersion" "rbac.authorization.k8s.io/v1"
  "kind" "RoleBinding"
  "metadata" (dict "name" $role.metadata.name "namespace" $role.metadata.namespace "labels" (include "aggregation-gateway.coreLabels" $root | fromYaml))
  "roleRef" (dict "apiGroup" "rbac.authorization.k8s.io" "kind" "Role" "name" $role.metadata.name)
  "subjects" $subjects) }}
{{- end }}
{{- end }}
{{- $docs := list }}
{{- range $rbac }}{{ $docs = append $docs (toYaml .) }}{{ end }}
{{- $_ := set $data "rbac.yaml" (join "\n---\n" $docs) }}
{{- end }}
{{- end }}
{{- if not $thisCluster }}
{{- with include "aggregation-gateway.metricsReaderRBAC" . }}
{{- $_ := set $data "metrics-reader.yaml" . }}
{{- end }}
{{- end }}
{{- if and $kube .Values.apiServices.createObjects .Values.apiServices.items (not $thisCluster) }}
{{- $docs := list }}
{{- range .Values.apiServices.items }}
{{- $docs = append $docs (include "aggregation-gateway.apiService" (dict "item" . "root" $root "core" true)) }}
{{- end }}
{{- $_ := set $data "apiservices.yaml" (join "\n---\n" $docs) }}
{{- end }}
{{- if $data }}{{ toYaml $data }}{{ end }}
{{- end }}
