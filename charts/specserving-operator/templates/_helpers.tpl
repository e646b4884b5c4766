{{/* The release's full name, at most 63 characters. */}}
{{- define "specserving-operator.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* Labels that never change, used in selectors. */}}
{{- define "specserving-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* Every object's labels. */}}
{{- define "specserving-operator.labels" -}}
{{ include "specserving-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "specserving-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "specserving-operator.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "specserving-operator.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{- define "specserving-operator.webhookService" -}}
{{- printf "%s-webhook" (include "specserving-operator.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "specserving-operator.tlsSecret" -}}
{{- printf "%s-webhook-tls" (include "specserving-operator.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The peering object's name: one per release, so two releases never pause each other. */}}
{{- define "specserving-operator.peering" -}}
{{- include "specserving-operator.fullname" . -}}
{{- end -}}
