{{/*
The gateway's config file (config.yaml), built from values. Keys are the gateway's Options in
camelCase (the flags: --secure-port is securePort); the gateway refuses unknown keys, and the chart's
tests run `aggregation-gateway --check-config` on what this renders. extraConfig wins.
*/}}
{{- define "aggregation-gateway.config" -}}
{{- $dir := include "aggregation-gateway.configDir" . }}
{{- $sa := include "aggregation-gateway.saDir" . }}
{{- $v := .Values }}
{{- $c := dict
  "bindAddress" $v.server.bindAddress
  "securePort" (int $v.server.port)
  "tlsMinVersion" $v.server.tlsMinVersion
  "http2MaxStreamsPerConnection" (int $v.server.http2MaxStreamsPerConnection)
  "coreUrl" (include "aggregation-gateway.coreUrl" .)
  "coreIdentity" $v.core.identity
  "apiserviceSource" $v.apiServices.source
  "enableAggregatorRouting" $v.serviceResolution.endpointRouting
  "apiserviceAvailabilityInterval" $v.apiServices.availabilityInterval
  "discoveryRefreshInterval" $v.apiServices.discoveryRefreshInterval
  "authenticationTokenWebhook" $v.authentication.tokenWebhook.enabled
  "authenticationTokenWebhookCacheTtl" $v.authentication.tokenWebhook.cacheTTL
  "authenticationTokenWebhookCacheUnauthorizedTtl" $v.authentication.tokenWebhook.cacheUnauthorizedTTL
  "authorizationWebhook" $v.authorization.webhook.enabled
  "authorizationWebhookCacheAuthorizedTtl" $v.authorization.webhook.cacheAuthorizedTTL
  "authorizationWebhookCacheUnauthorizedTtl" $v.authorization.webhook.cacheUnauthorizedTTL
  "authorizeMetrics" $v.authorization.authorizeMetrics
  "enablePriorityAndFairness" $v.limits.enablePriorityAndFairness
  "maxRequestsInflight" (int $v.limits.maxRequestsInflight)
  "maxMutatingRequestsInflight" (int $v.limits.maxMutatingRequestsInflight)
  "requestTimeout" $v.limits.requestTimeout
  "maxRequestBodyBytes" (int64 $v.limits.maxRequestBodyBytes)
  "headerReadTimeout" $v.limits.headerReadTimeout
  "maxHeaderBytes" (int $v.limits.maxHeaderBytes)
  "shutdownDelayDuration" $v.shutdown.delayDuration
  "shutdownTimeout" $v.shutdown.timeout
  "loggingFormat" $v.logging.format
  "logLevel" $v.logging.level
  "auditPolicyLevel" $v.logging.auditPolicyLevel
}}
{{- with $v.server.tlsCipherSuites }}{{ $_ := set $c "tlsCipherSuites" . }}{{ end }}
{{- with $v.logging.auditLogPath }}{{ $_ := set $c "auditLogPath" . }}{{ end }}
{{- if include "aggregation-gateway.servingSecret" . }}
{{- $_ := set $c "tlsCertFile" (printf "%s/serving/tls.crt" $dir) }}
{{- $_ := set $c "tlsPrivateKeyFile" (printf "%s/serving/tls.key" $dir) }}
{{- end }}
{{- if include "aggregation-gateway.proxyClientSecret" . }}
{{- $_ := set $c "proxyClientCertFile" (printf "%s/proxy-client/tls.crt" $dir) }}
{{- $_ := set $c "proxyClientKeyFile" (printf "%s/proxy-client/tls.key" $dir) }}
{{- end }}
{{- /* Structured authentication: the file's `anonymous`, when set, replaces anonymousAuth (the
gateway refuses both, as kube-apiserver does); null anonymous renders no anonymousAuth either. */}}
{{- $fileAnonymous := include "aggregation-gateway.authenticationFileAnonymous" . }}
{{- if $fileAnonymous }}
{{- if hasKey $v.extraConfig "anonymousAuth" }}
{{- fail "extraConfig.anonymousAuth cannot be set when authentication.config has anonymous (anonymous: Forbidden: --anonymous-auth flag cannot be set when anonymous field is configured in authentication configuration file)" }}
{{- end }}
{{- else if kindIs "bool" $v.authentication.anonymous }}
{{- $_ := set $c "anonymousAuth" $v.authentication.anonymous }}
{{- end }}
{{- if include "aggregation-gateway.authenticationConfigMap" . }}
{{- $_ := set $c "authenticationConfig" (printf "%s/authentication/authentication-config.yaml" $dir) }}
{{- end }}
{{- with $v.authentication.clientCASecret }}
{{- $_ := set $c "clientCaFile" (printf "%s/client-ca/ca.crt" $dir) }}
{{- end }}
{{- if $v.authentication.requestHeader.caSecret }}
{{- $_ := set $c "requestheaderClientCaFile" (printf "%s/requestheader-ca/ca.crt" $dir) }}
{{- with $v.authentication.requestHeader.allowedNames }}{{ $_ := set $c "requestheaderAllowedNames" . }}{{ end }}
{{- else if $v.authentication.requestHeader.allowedNames }}
{{- fail "authentication.requestHeader.allowedNames needs authentication.requestHeader.caSecret: names are only checked on certificates that CA signed" }}
{{- end }}
{{- /* The gateway's own credentials towards the core. */}}
{{- $https := include "aggregation-gateway.coreIsHttps" . }}
{{- if $v.core.caSecret }}
{{- if not $https }}{{ fail "core.caSecret only applies to an https:// core (core.url, or core.sidecar.scheme: https)" }}{{ end }}
{{- $_ := set $c "coreCaFile" (printf "%s/core-ca/ca.crt" $dir) }}
{{- else if and $https $v.core.serviceAccountAuth }}
{{- $_ := set $c "coreCaFile" (printf "%s/ca.crt" $sa) }}
{{- end }}
{{- if $v.core.clientCertSecret }}
{{- $_ := set $c "coreClientCertFile" (printf "%s/core-client/tls.crt" $dir) }}
{{- $_ := set $c "coreClientKeyFile" (printf "%s/core-client/tls.key" $dir) }}
{{- end }}
{{- if $v.core.tokenSecret }}
{{- $_ := set $c "coreTokenFile" (printf "%s/core-token/token" $dir) }}
{{- else if $v.core.serviceAccountAuth }}
{{- $_ := set $c "coreTokenFile" (printf "%s/token" $sa) }}
{{- end }}
{{- /* APIServices. */}}
{{- if eq $v.apiServices.source "file" }}
{{- $_ := set $c "apiserviceDir" (printf "%s/apiservices" $dir) }}
{{- else if and (eq $v.apiServices.source "kube") $v.apiServices.labelSelector }}
{{- $_ := set $c "apiserviceLabelSelector" $v.apiServices.labelSelector }}
{{- end }}
{{- $_ := set $c "readyzAggregatedApiserviceReachable" $v.probes.readiness.aggregatedApiserviceReachable }}
{{- if eq $v.apiServices.source "kube" }}
{{- $_ := set $c "leaderElect" $v.leaderElection.enabled }}
{{- if $v.leaderElection.enabled }}
{{- $_ := set $c "leaderElectLeaseDuration" $v.leaderElection.leaseDuration }}
{{- $_ := set $c "leaderElectRenewDeadline" $v.leaderElection.renewDeadline }}
{{- $_ := set $c "leaderElectRetryPeriod" $v.leaderElection.retryPeriod }}
{{- $_ := set $c "leaderElectResourceName" (include "aggregation-gateway.leaseName" .) }}
{{- $_ := set $c "leaderElectResourceNamespace" (include "aggregation-gateway.leaseNamespace" .) }}
{{- end }}
{{- end }}
{{- with $v.serviceResolution.staticServices }}
{{- $services := list }}
{{- range . }}
{{- $s := dict "namespace" .namespace "name" .name "urls" .urls }}
{{- if .port }}{{ $_ := set $s "port" (int .port) }}{{ end }}
{{- $services = append $services $s }}
{{- end }}
{{- $_ := set $c "services" $services }}
{{- end }}
{{- toYaml (mergeOverwrite $c $v.extraConfig) }}
{{- end }}
