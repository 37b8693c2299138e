{{/* The chart's name, or nameOverride. */}}
{{- define "drip.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The objects' name: fullnameOverride, else the release name, with the chart's name unless the release name holds it. Short enough for the -ratelimit suffix. */}}
{{- define "drip.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- $name := include "drip.name" . -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The labels every object carries. */}}
{{- define "drip.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "drip.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | trunc 63 | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* The labels that select the pods. */}}
{{- define "drip.selectorLabels" -}}
app.kubernetes.io/name: {{ include "drip.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* The rules ConfigMap's name, or none. */}}
{{- define "drip.rulesConfigMap" -}}
{{- if .Values.rules.existingConfigMap -}}
{{- .Values.rules.existingConfigMap -}}
{{- else if .Values.rules.files -}}
{{- include "drip.fullname" . }}-rules
{{- end -}}
{{- end -}}

{{/* "true" when the store's URL comes from a Secret (mounted as a file), else empty. */}}
{{- define "drip.storeSecret" -}}
{{- if and (has .Values.store.type (list "redis" "sentinel" "postgres")) .Values.store.existingSecret -}}
true
{{- end -}}
{{- end -}}

{{/* Values the schema cannot check: fail with a message that says why. */}}
{{- define "drip.validate" -}}
{{- if and (eq .Values.store.type "memory") (gt (int .Values.replicaCount) 1) -}}
{{- fail "store.type memory keeps buckets in each replica's own memory, so a client would get its limit once per replica: set replicaCount 1, or a shared store (redis, sentinel, postgres)" -}}
{{- end -}}
{{- if and (has .Values.store.type (list "redis" "sentinel" "postgres")) (not .Values.store.existingSecret) -}}
{{- fail (printf "store.type %s: set store.existingSecret to a Secret whose key %q holds the store URL (kubectl create secret generic drip-store --from-literal=url=...)" .Values.store.type .Values.store.secretKey) -}}
{{- end -}}
{{- if and .Values.metrics.serviceMonitor.enabled (not .Values.metrics.serviceMonitor.interval) -}}
{{- fail "metrics.serviceMonitor.interval: empty" -}}
{{- end -}}
{{- if and .Values.podDisruptionBudget.enabled (gt (int .Values.replicaCount) 1) (ge (int .Values.podDisruptionBudget.maxUnavailable) (int .Values.replicaCount)) -}}
{{- fail (printf "podDisruptionBudget.maxUnavailable %v with replicaCount %v: a drain could take every replica" .Values.podDisruptionBudget.maxUnavailable .Values.replicaCount) -}}
{{- end -}}
{{- end -}}
