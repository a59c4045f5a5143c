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
