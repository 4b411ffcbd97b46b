{{/* Names, labels and derived settings shared by the templates. */}}

{{- define "fleetinfer-spoke.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* fullname prefixes every object; cluster-scoped ones need it unique per release. */}}
{{- define "fleetinfer-spoke.fullname" -}}
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

{{- define "fleetinfer-spoke.selectorLabels" -}}
app.kubernetes.io/name: {{ include "fleetinfer-spoke.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "fleetinfer-spoke.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "fleetinfer-spoke.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: fleetinfer
{{- end }}

{{- define "fleetinfer-spoke.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "fleetinfer-spoke.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* image renders repository:tag, or repository@digest when a digest is set. */}}
{{- define "fleetinfer-spoke.image" -}}
{{- if .image.digest }}
{{- printf "%s@%s" .image.repository .image.digest }}
{{- else }}
{{- printf "%s:%s" .image.repository (default .appVersion .image.tag) }}
{{- end }}
{{- end }}

{{/* leaderElect is "true" when more than one replica runs or it is forced on. */}}
{{- define "fleetinfer-spoke.leaderElect" -}}
{{- or .Values.leaderElection.enabled (gt (int .Values.replicas) 1) }}
{{- end }}

{{- define "fleetinfer-spoke.defaultGateway" -}}
{{- default (printf "%s/inference-gateway" .Release.Namespace) .Values.controller.defaultGateway }}
{{- end }}

{{/* federationIdentity is the URI SAN peers list for this cluster's EPPs. */}}
{{- define "fleetinfer-spoke.federationIdentity" -}}
{{- printf "spiffe://%s/%s/epp" .Values.federation.tls.certManager.trustDomain .Values.federation.clusterName }}
{{- end }}
