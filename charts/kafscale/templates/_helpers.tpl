{{/*
Names and labels shared by the templates. Objects are named after the release: a release named
kafscale makes kafscale-operator (Deployment, ServiceAccount, Roles) and kafscale-operator-crds
(the ClusterRole that reads CRDs).
*/}}

{{- define "kafscale.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "kafscale.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 58 | trimSuffix "-" -}}
{{- else -}}
{{- $name := include "kafscale.name" . -}}
{{- $base := ternary .Release.Name (printf "%s-%s" .Release.Name $name) (contains $name .Release.Name) -}}
{{- printf "%s-operator" ($base | trunc 49 | trimSuffix "-") -}}
{{- end -}}
{{- end -}}

{{- define "kafscale.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "kafscale.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name: name an existing ServiceAccount when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* Labels that select the operator's pod: never change them in an upgrade. */}}
{{- define "kafscale.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kafscale.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "kafscale.labels" -}}
{{ include "kafscale.selectorLabels" . }}
{{ include "kafscale.commonLabels" . }}
{{- end -}}

{{/* Labels of every object that select nothing. */}}
{{- define "kafscale.commonLabels" -}}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/*
The console (console.enabled): <release>-console (or <fullnameOverride>-console), its pod
selected by component console, so the operator's selector never matches it.
*/}}
{{- define "kafscale.consoleFullname" -}}
{{- if .Values.fullnameOverride -}}
{{- printf "%s-console" (.Values.fullnameOverride | trunc 55 | trimSuffix "-") -}}
{{- else -}}
{{- $name := include "kafscale.name" . -}}
{{- $base := ternary .Release.Name (printf "%s-%s" .Release.Name $name) (contains $name .Release.Name) -}}
{{- printf "%s-console" ($base | trunc 49 | trimSuffix "-") -}}
{{- end -}}
{{- end -}}

{{- define "kafscale.consoleSelectorLabels" -}}
app.kubernetes.io/name: {{ include "kafscale.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: console
{{- end -}}

{{- define "kafscale.consoleLabels" -}}
{{ include "kafscale.consoleSelectorLabels" . }}
{{ include "kafscale.commonLabels" . }}
{{- end -}}

{{- define "kafscale.image" -}}
{{- printf "%s:%s" .repository (default .appVersion .tag) -}}
{{- end -}}

{{/* KAFSCALE_OPERATOR_ADDRESS_MAP: the map as host:port=host:port pairs, keys sorted. */}}
{{- define "kafscale.addressMap" -}}
{{- $pairs := list -}}
{{- range $from, $to := .Values.operator.addressMap -}}
{{- $pairs = append $pairs (printf "%s=%s" $from $to) -}}
{{- end -}}
{{- join "," $pairs -}}
{{- end -}}

{{/*
The rules of the operator in the namespaces it watches (least privilege: docs/design/operator.md
lists what it writes). kopf adds its finalizers by patching the resources.
*/}}
{{- define "kafscale.namespacedRules" -}}
- apiGroups: [kafscale.io]
  resources: [kafscaleclusters, kafscaletopics, kafscaleusers]
  verbs: [get, list, watch, patch, update]
- apiGroups: [kafscale.io]
  resources: [kafscaleclusters/status, kafscaletopics/status, kafscaleusers/status]
  verbs: [get, patch, update]
# Secrets: the clusters' admin credentials and users' passwords are read, generated ones created.
- apiGroups: [""]
  resources: [configmaps, services, secrets]
  verbs: [get, list, watch, create, patch, update, delete]
- apiGroups: [""]
  resources: [events]
  verbs: [create, patch]
- apiGroups: [events.k8s.io]
  resources: [events]
  verbs: [create, patch]
- apiGroups: [apps]
  resources: [statefulsets]
  verbs: [get, list, watch, create, patch, update, delete]
- apiGroups: [policy]
  resources: [poddisruptionbudgets]
  verbs: [get, list, watch, create, patch, update, delete]
- apiGroups: [autoscaling]
  resources: [horizontalpodautoscalers]
  verbs: [get, list, watch, create, patch, update, delete]
- apiGroups: [batch]
  resources: [cronjobs]
  verbs: [get, list, watch, create, patch, update, delete]
- apiGroups: [monitoring.coreos.com]
  resources: [servicemonitors]
  verbs: [get, list, watch, create, patch, update, delete]
{{- end -}}
