{{/* Names, labels and the pieces every workload shares. */}}

{{- define "runlease.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "runlease.fullname" -}}
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

{{- define "runlease.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels of every object; call with (dict "ctx" $ "component" "operator"). */}}
{{- define "runlease.labels" -}}
helm.sh/chart: {{ include "runlease.chart" .ctx }}
{{ include "runlease.selectorLabels" . }}
app.kubernetes.io/version: {{ .ctx.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
app.kubernetes.io/part-of: runlease
{{- with .ctx.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "runlease.selectorLabels" -}}
app.kubernetes.io/name: {{ include "runlease.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
{{- with .component }}
app.kubernetes.io/component: {{ . }}
{{- end }}
{{- end }}

{{- define "runlease.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{- define "runlease.operatorServiceAccount" -}}
{{- if .Values.operator.serviceAccount.create }}
{{- default (printf "%s-operator" (include "runlease.fullname" .)) .Values.operator.serviceAccount.name }}
{{- else }}
{{- required "operator.serviceAccount.name: name the existing ServiceAccount when serviceAccount.create is false" .Values.operator.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The namespaces the operator watches, as a JSON list (empty when it watches all). */}}
{{- define "runlease.watchNamespaces" -}}
{{- if .Values.operator.allNamespaces }}
{{- list | toJson }}
{{- else if .Values.operator.watchNamespaces }}
{{- .Values.operator.watchNamespaces | uniq | toJson }}
{{- else }}
{{- list .Release.Namespace | toJson }}
{{- end }}
{{- end }}

{{- define "runlease.peeringName" -}}
{{- default (include "runlease.fullname" .) .Values.operator.peering.name }}
{{- end }}

{{/* The database URL's Secret: the chart's own when database.url is set. */}}
{{- define "runlease.databaseSecret" -}}
{{- if .Values.database.url }}
{{- printf "%s-database" (include "runlease.fullname" .) }}
{{- else }}
{{- required "set database.url or database.existingSecret" .Values.database.existingSecret }}
{{- end }}
{{- end }}

{{- define "runlease.databaseKey" -}}
{{- if .Values.database.url }}url{{ else }}{{ .Values.database.existingSecretKey }}{{ end }}
{{- end }}

{{- define "runlease.databaseEnv" -}}
- name: RUNLEASE_DATABASE_URL
  valueFrom:
    secretKeyRef:
      name: {{ include "runlease.databaseSecret" . }}
      key: {{ include "runlease.databaseKey" . }}
{{- end }}

{{/* Behind PgBouncer in transaction mode: the direct URL's Secret for LISTEN
     (listen=true: the API's), and prepared statements off. */}}
{{- define "runlease.pgbouncerEnv" -}}
{{- if and .listen .ctx.Values.database.listenExistingSecret }}
- name: RUNLEASE_LISTEN_DATABASE_URL
  valueFrom:
    secretKeyRef:
      name: {{ .ctx.Values.database.listenExistingSecret }}
      key: {{ .ctx.Values.database.listenExistingSecretKey }}
{{- end }}
{{- if not .ctx.Values.database.preparedStatements }}
- name: RUNLEASE_PREPARED_STATEMENTS
  value: "false"
{{- end }}
{{- end }}

{{- define "runlease.commonEnv" -}}
- name: RUNLEASE_LOG_LEVEL
  value: {{ .Values.logLevel | quote }}
- name: RUNLEASE_LOG_JSON
  value: {{ .Values.logJson | quote }}
{{- end }}

{{/* The API's tokens Secret: the given one, or the chart's when tokens are inline. */}}
{{- define "runlease.apiTokensSecret" -}}
{{- if .Values.api.existingSecret }}
{{- .Values.api.existingSecret }}
{{- else if or .Values.api.tokens .Values.api.adminTokens }}
{{- printf "%s-api-tokens" (include "runlease.fullname" .) }}
{{- end }}
{{- end }}

{{- define "runlease.consoleSecret" -}}
{{- default (printf "%s-api-console" (include "runlease.fullname" .)) .Values.api.consoleSecret.existingSecret }}
{{- end }}

{{- define "runlease.streamTokenSecret" -}}
{{- default (printf "%s-api-stream" (include "runlease.fullname" .)) .Values.api.streamTokenSecret.existingSecret }}
{{- end }}

{{/* Pod-level settings shared by the operator and the API; call with (dict "ctx" $ "v" .Values.operator). */}}
{{- define "runlease.podCommon" -}}
{{- with .ctx.Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .ctx.Values.podSecurityContext }}
securityContext:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .v.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with .v.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .v.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .v.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
terminationGracePeriodSeconds: {{ .v.terminationGracePeriodSeconds }}
{{- end }}
