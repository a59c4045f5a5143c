{{/* vim: set filetype=mustache: */}}

{{/* Chart name, overridable with nameOverride. */}}
{{- define "aggregation-gateway.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Fully qualified app name: the release name, plus the chart name unless the release already holds it. */}}
{{- define "aggregation-gateway.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* chart label value: name-version. */}}
{{- define "aggregation-gateway.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels on every object. */}}
{{- define "aggregation-gateway.labels" -}}
helm.sh/chart: {{ include "aggregation-gateway.chart" . }}
{{ include "aggregation-gateway.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: aggregation-gateway
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/*
Labels on objects meant for the core server (the <fullname>-core ConfigMap's manifests): Helm does not
manage them there, so no managed-by or chart label claims it does.
*/}}
{{- define "aggregation-gateway.coreLabels" -}}
{{ include "aggregation-gateway.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: aggregation-gateway
{{- end }}

{{/* Labels that select the gateway Pods (immutable once installed). */}}
{{- define "aggregation-gateway.selectorLabels" -}}
app.kubernetes.io/name: {{ include "aggregation-gateway.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "aggregation-gateway.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "aggregation-gateway.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "aggregation-gateway.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}
{{- end }}

{{/* Where everything the gateway reads is mounted. */}}
{{- define "aggregation-gateway.configDir" -}}/etc/aggregation-gateway{{- end }}
{{- define "aggregation-gateway.saDir" -}}/var/run/secrets/kubernetes.io/serviceaccount{{- end }}

{{/* The Secret holding the serving certificate, or "" for a self-signed one generated at start. */}}
{{- define "aggregation-gateway.servingSecret" -}}
{{- if and .Values.certManager.enabled .Values.certManager.serving.enabled }}
{{- printf "%s-serving" (include "aggregation-gateway.fullname" .) }}
{{- else }}
{{- .Values.tls.serving.secretName }}
{{- end }}
{{- end }}

{{/* The Secret holding the proxy client certificate, or "" for none. */}}
{{- define "aggregation-gateway.proxyClientSecret" -}}
{{- if and .Values.certManager.enabled .Values.certManager.proxyClient.enabled }}
{{- printf "%s-proxy-client" (include "aggregation-gateway.fullname" .) }}
{{- else }}
{{- .Values.tls.proxyClient.secretName }}
{{- end }}
{{- end }}

{{/* The core server URL the gateway is configured with. */}}
{{- define "aggregation-gateway.coreUrl" -}}
{{- if .Values.core.sidecar.enabled }}
{{- printf "%s://127.0.0.1:%d" .Values.core.sidecar.scheme (int .Values.core.sidecar.port) }}
{{- else }}
{{- required "core.url is required when core.sidecar.enabled is false: set core.url to the API server the gateway fronts, or enable core.sidecar" .Values.core.url }}
{{- end }}
{{- end }}

{{/* "true" when the core is reached over https. */}}
{{- define "aggregation-gateway.coreIsHttps" -}}
{{- if hasPrefix "https://" (include "aggregation-gateway.coreUrl" .) }}true{{ end }}
{{- end }}

{{/*
"true" when the Pod's ServiceAccount token is the gateway's credential towards the core (and so
must be mounted). That is also the one case where RBAC in the cluster the chart is installed into
authorizes the gateway's own requests: nothing else of the gateway talks to this cluster's API.
*/}}
{{- define "aggregation-gateway.useServiceAccountToken" -}}
{{- if and .Values.core.serviceAccountAuth (not .Values.core.tokenSecret) }}true{{ end }}
{{- end }}

{{/*
"true" when the core is the API server of the cluster the chart is installed into, i.e. core.url
names the in-cluster kubernetes Service. Only then can objects meant for the core (APIServices) be
installed by Helm itself; any other core is a server Helm never talks to.
*/}}
{{- define "aggregation-gateway.coreIsThisCluster" -}}
{{- if and (not .Values.core.sidecar.enabled) (regexMatch "^https://kubernetes\\.default(\\.svc(\\.[a-z0-9.-]+)?)?(:443)?/?$" (toString .Values.core.url)) }}true{{ end }}
{{- end }}

{{/*
The RBAC rules for the gateway's own requests to the core, each only when the feature needing it
is on, as a YAML list ("" when there are none).
*/}}
{{- define "aggregation-gateway.rbacRules" -}}
{{- $rules := list }}
{{- /* The core's discovery is merged whatever the source, and kept fresh by watching the two
resources it is made of (kube-apiserver lists a CRD group once established, and a local APIService
per group); without them it is polled. The kube source reads APIServices from the same watch. */}}
{{- $rules = append $rules (dict "apiGroups" (list "apiextensions.k8s.io") "resources" (list "customresourcedefinitions") "verbs" (list "get" "list" "watch")) }}
{{- $rules = append $rules (dict "apiGroups" (list "apiregistration.k8s.io") "resources" (list "apiservices") "verbs" (list "get" "list" "watch")) }}
{{- if eq .Values.apiServices.source "kube" }}
{{- /* The Available condition is read back (get) before it is patched, as kube-aggregator's
availability controller does. */}}
{{- $rules = append $rules (dict "apiGroups" (list "apiregistration.k8s.io") "resources" (list "apiservices/status") "verbs" (list "get" "update" "patch")) }}
{{- end }}
{{- if and .Values.serviceResolution.enabled (ne .Values.apiServices.source "none") }}
{{- $rules = append $rules (dict "apiGroups" (list "") "resources" (list "services") "verbs" (list "get" "list" "watch")) }}
{{- $rules = append $rules (dict "apiGroups" (list "discovery.k8s.io") "resources" (list "endpointslices") "verbs" (list "get" "list" "watch")) }}
{{- end }}
{{- if .Values.authentication.tokenWebhook.enabled }}
{{- $rules = append $rules (dict "apiGroups" (list "authentication.k8s.io") "resources" (list "tokenreviews") "verbs" (list "create")) }}
{{- end }}
{{- /* extraConfig wins over limits in the config file, so it does here too. */}}
{{- $apf := ne (toString (dig "enablePriorityAndFairness" .Values.limits.enablePriorityAndFairness .Values.extraConfig)) "false" }}
{{- /* SubjectAccessReviews: for remote APIServices (the webhook), for /metrics (authorizeMetrics),
and for the API Priority and Fairness debug dumps, which the gateway authorizes whenever it serves
them (kube-apiserver always does: they name the users and paths in flight). */}}
{{- if or .Values.authorization.webhook.enabled .Values.authorization.authorizeMetrics $apf }}
{{- $rules = append $rules (dict "apiGroups" (list "authorization.k8s.io") "resources" (list "subjectaccessreviews") "verbs" (list "create")) }}
{{- end }}
{{- /* API Priority and Fairness reads the core's configuration (kube source only; read only). */}}
{{- if and (eq .Values.apiServices.source "kube") $apf }}
{{- $rules = append $rules (dict "apiGroups" (list "flowcontrol.apiserver.k8s.io") "resources" (list "flowschemas" "prioritylevelconfigurations") "verbs" (list "get" "list" "watch")) }}
{{- end }}
{{- if $rules }}{{ toYaml $rules }}{{ end }}
{{- end }}

{{/* "true" when the replicas elect the one that writes APIService status (kube source only). */}}
{{- define "aggregation-gateway.leaderElection" -}}
{{- if and (eq .Values.apiServices.source "kube") .Values.leaderElection.enabled }}true{{ end }}
{{- end }}

{{- define "aggregation-gateway.leaseName" -}}
{{- default (include "aggregation-gateway.fullname" .) .Values.leaderElection.name }}
{{- end }}

{{- define "aggregation-gateway.leaseNamespace" -}}
{{- default .Release.Namespace .Values.leaderElection.namespace }}
{{- end }}

{{/*
The Role for the leader-election Lease, as a list of YAML objects: read and renew that one Lease
by name, and create it (create cannot be limited by name). Context: dict "root" $ "labels" include-name.
*/}}
{{- define "aggregation-gateway.leaderElectionRole" -}}
{{- $root := .root }}
{{- $name := printf "%s-leader-election" (include "aggregation-gateway.fullname" $root) }}
{{- toYaml (dict
  "apiVersion" "rbac.authorization.k8s.io/v1"
  "kind" "Role"
  "metadata" (dict "name" $name "namespace" (include "aggregation-gateway.leaseNamespace" $root) "labels" (include .labels $root | fromYaml))
  "rules" (list
    (dict "apiGroups" (list "coordination.k8s.io") "resources" (list "leases") "resourceNames" (list (include "aggregation-gateway.leaseName" $root)) "verbs" (list "get" "update"))
    (dict "apiGroups" (list "coordination.k8s.io") "resources" (list "leases") "verbs" (list "create")))) }}
{{- end }}

{{/* "true" when the gateway keeps kube-system/extension-apiserver-authentication on the core. */}}
{{- define "aggregation-gateway.managesAuthenticationConfigMap" -}}
{{- if ne (toString (dig "manageExtensionApiserverAuthentication" true .Values.extraConfig)) "false" }}true{{ end }}
{{- end }}

{{/*
The Role for kube-system/extension-apiserver-authentication, as a YAML object: that one ConfigMap
by name, and create (which cannot be limited by name). Context: dict "root" $ "labels" include-name.
*/}}
{{- define "aggregation-gateway.authenticationRole" -}}
{{- $root := .root }}
{{- toYaml (dict
  "apiVersion" "rbac.authorization.k8s.io/v1"
  "kind" "Role"
  "metadata" (dict "name" (printf "%s-authentication" (include "aggregation-gateway.fullname" $root)) "namespace" "kube-system" "labels" (include .labels $root | fromYaml))
  "rules" (list
    (dict "apiGroups" (list "") "resources" (list "configmaps") "resourceNames" (list "extension-apiserver-authentication") "verbs" (list "get" "list" "watch" "update"))
    (dict "apiGroups" (list "") "resources" (list "configmaps") "verbs" (list "create")))) }}
{{- end }}

{{/*
A Go duration (1h2m3s, 10s, 500ms) in whole seconds, rounded up. Used to size
terminationGracePeriodSeconds and the core's preStop sleep from the gateway's shutdown settings.
*/}}
{{- define "aggregation-gateway.durationSeconds" -}}
{{- $total := 0.0 }}
{{- range regexFindAll "[0-9]+(\\.[0-9]+)?(ns|us|µs|ms|h|m|s)" (toString .) -1 }}
{{- $num := regexFind "^[0-9]+(\\.[0-9]+)?" . | float64 }}
{{- $unit := trimPrefix (regexFind "^[0-9]+(\\.[0-9]+)?" .) . }}
{{- if eq $unit "h" }}{{ $total = addf $total (mulf $num 3600) }}
{{- else if eq $unit "m" }}{{ $total = addf $total (mulf $num 60) }}
{{- else if eq $unit "s" }}{{ $total = addf $total $num }}
{{- else if eq $unit "ms" }}{{ $total = addf $total (divf $num 1000) }}
{{- end }}
{{- end }}
{{- ceil $total | int }}
{{- end }}

{{- define "aggregation-gateway.terminationGracePeriodSeconds" -}}
{{- if .Values.shutdown.terminationGracePeriodSeconds }}
{{- .Values.shutdown.terminationGracePeriodSeconds | int }}
{{- else }}
{{- $delay := include "aggregation-gateway.durationSeconds" .Values.shutdown.delayDuration | int }}
{{- $timeout := include "aggregation-gateway.durationSeconds" .Values.shutdown.timeout | int }}
{{- add $delay $timeout 5 }}
{{- end }}
{{- end }}

{{/* Name of an APIService item: <version>.<group> unless given. */}}
{{- define "aggregation-gateway.apiServiceName" -}}
{{- $group := required "apiServices.items[].group is required" .group }}
{{- $version := required (printf "apiServices.items[] (group %s): version is required" $group) .version }}
{{- default (printf "%s.%s" $version $group) .name }}
{{- end }}

{{/*
An APIService manifest from an apiServices.items entry. Context: dict "item" "root" ["core" true];
with core, labelled for applying to the core rather than as a release object.
*/}}
{{- define "aggregation-gateway.apiService" -}}
{{- $item := .item -}}
apiVersion: apiregistration.k8s.io/v1
kind: APIService
metadata:
  name: {{ include "aggregation-gateway.apiServiceName" $item }}
  labels:
    {{- include (ternary "aggregation-gateway.coreLabels" "aggregation-gateway.labels" (default false .core)) .root | nindent 4 }}
    {{- with $item.labels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- with $item.annotations }}
  annotations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
spec:
  group: {{ $item.group | quote }}
  version: {{ $item.version | quote }}
  groupPriorityMinimum: {{ $item.groupPriorityMinimum | default 1000 | int }}
  versionPriority: {{ $item.versionPriority | default 15 | int }}
  {{- with $item.service }}
  service:
    namespace: {{ required (printf "apiServices.items (%s): service.namespace is required" $item.group) .namespace | quote }}
    name: {{ required (printf "apiServices.items (%s): service.name is required" $item.group) .name | quote }}
    port: {{ .port | default 443 | int }}
  {{- end }}
  {{- if $item.insecureSkipTLSVerify }}
  insecureSkipTLSVerify: true
  {{- end }}
  {{- with $item.caBundle }}
  caBundle: {{ . | quote }}
  {{- end }}
{{- end }}

{{/*
The ClusterRole <fullname>-metrics-reader (get on the /metrics non-resource URL) and its binding
to monitoring.serviceMonitor.scraperSubjects, as YAML documents joined by "---", or "" when not
wanted: only with the ServiceMonitor, authorization.authorizeMetrics and rbac.create. Where it
goes depends on where the gateway's SubjectAccessReview is answered: this cluster when it is the
core (metrics-rbac.yaml), the <fullname>-core manifests otherwise (_core.tpl).
*/}}
{{- define "aggregation-gateway.metricsReaderRBAC" -}}
{{- $sm := .Values.monitoring.serviceMonitor }}
{{- if and $sm.enabled .Values.authorization.authorizeMetrics .Values.rbac.create $sm.scraperSubjects }}
{{- $name := printf "%s-metrics-reader" (include "aggregation-gateway.fullname" .) }}
{{- $subjects := list }}
{{- range $sm.scraperSubjects }}
{{- $s := deepCopy . }}
{{- if and (has .kind (list "User" "Group")) (not .apiGroup) }}{{ $_ := set $s "apiGroup" "rbac.authorization.k8s.io" }}{{ end }}
{{- if and (eq .kind "ServiceAccount") (not .namespace) }}
{{- fail (printf "monitoring.serviceMonitor.scraperSubjects: ServiceAccount %s needs a namespace" .name) }}
{{- end }}
{{- $subjects = append $subjects $s }}
{{- end }}
{{- /* Helm's labels only where Helm installs it; the core's copy is applied by hand. */}}
{{- $labelsOf := ternary "aggregation-gateway.labels" "aggregation-gateway.coreLabels" (not (empty (include "aggregation-gateway.coreIsThisCluster" .))) }}
{{- $labels := include $labelsOf . | fromYaml }}
{{- toYaml (dict
  "apiVersion" "rbac.authorization.k8s.io/v1"
  "kind" "ClusterRole"
  "metadata" (dict "name" $name "labels" $labels)
  "rules" (list (dict "nonResourceURLs" (list "/metrics") "verbs" (list "get")))) }}
---
{{ toYaml (dict
  "apiVersion" "rbac.authorization.k8s.io/v1"
  "kind" "ClusterRoleBinding"
  "metadata" (dict "name" $name "labels" $labels)
  "roleRef" (dict "apiGroup" "rbac.authorization.k8s.io" "kind" "ClusterRole" "name" $name)
  "subjects" $subjects) }}
{{- end }}
{{- end }}

{{/*
The ConfigMap holding the structured authentication file (key authentication-config.yaml):
<fullname>-authentication rendered from authentication.config, or the user's
authentication.configMap, or "" for no file.
*/}}
{{- define "aggregation-gateway.authenticationConfigMap" -}}
{{- $auth := .Values.authentication }}
{{- if and $auth.config $auth.configMap }}
{{- fail "authentication.config and authentication.configMap are both set: the authentication file comes from one of them" }}
{{- else if $auth.config }}
{{- printf "%s-authentication" (include "aggregation-gateway.fullname" .) }}
{{- else }}
{{- $auth.configMap }}
{{- end }}
{{- end }}

{{/* "true" when authentication.config sets `anonymous`, which then replaces anonymousAuth. */}}
{{- define "aggregation-gateway.authenticationFileAnonymous" -}}
{{- with .Values.authentication.config }}{{ if hasKey . "anonymous" }}true{{ end }}{{ end }}
{{- end }}

{{/*
The AuthenticationConfiguration file from authentication.config: apiVersion and kind first (v1
unless given), then the body as the user wrote it.
*/}}
{{- define "aggregation-gateway.authenticationConfiguration" -}}
{{- $file := .Values.authentication.config -}}
apiVersion: {{ $file.apiVersion | default "apiserver.config.k8s.io/v1" }}
kind: {{ $file.kind | default "AuthenticationConfiguration" }}
{{- with omit $file "apiVersion" "kind" }}
{{ toYaml . }}
{{- end }}
{{- end }}
