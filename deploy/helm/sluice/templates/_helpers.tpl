{{/*
Names and labels shared by every template.
*/}}

{{- define "sluice.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The release's objects: `<release>-sluice`, or the release name when it says sluice already. */}}
{{- define "sluice.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "sluice.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "sluice.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* What selects the gateway's pods: never changes across upgrades (a Deployment's selector is immutable). */}}
{{- define "sluice.selectorLabels" -}}
app.kubernetes.io/name: {{ include "sluice.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: gateway
{{- end -}}

{{- define "sluice.labels" -}}
{{ include "sluice.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end -}}

{{/* repository@digest when a digest is given (it wins), else repository:tag (tag defaults to appVersion). */}}
{{- define "sluice.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{/*
The namespaces whose GatewayPlugins and AIModelRoutes the gateway reads, as
a JSON list: watchNamespaces, or the release's own namespace. `sluice run`
takes one --watch-namespace (or none, for all namespaces), so more than one
is refused here rather than rendered into a pod that would not start.
*/}}
{{- define "sluice.watchNamespaces" -}}
{{- if .Values.watchAllNamespaces -}}
{{- if .Values.watchNamespaces -}}
{{- fail "set watchNamespaces or watchAllNamespaces, not both" -}}
{{- end -}}
{{- list | toJson -}}
{{- else -}}
{{- $namespaces := .Values.watchNamespaces | default (list .Release.Namespace) | uniq -}}
{{- if gt (len $namespaces) 1 -}}
{{- fail (printf "watchNamespaces names %d namespaces (%s), but the gateway watches one (sluice run --watch-namespace) or all of them: install one release per namespace, each in a namespace of its own (their leader Leases share a name), or set watchAllNamespaces=true (the gateway may then read every Secret in the cluster)" (len $namespaces) (join ", " $namespaces)) -}}
{{- end -}}
{{- $namespaces | toJson -}}
{{- end -}}
{{- end -}}

{{/*
A file from a ConfigMap or a Secret: {configMap: NAME, key: KEY} or
{secret: NAME, key: KEY}, rendered as a volume source (one item, the key).
*/}}
{{- define "sluice.fileVolume" -}}
{{- $source := .source -}}
{{- if and $source.configMap $source.secret -}}
{{- fail (printf "%s: set configMap or secret, not both" .what) -}}
{{- end -}}
{{- if $source.configMap }}
configMap:
  name: {{ $source.configMap }}
  items:
    - key: {{ $source.key }}
      path: {{ $source.key }}
{{- else if $source.secret }}
secret:
  secretName: {{ $source.secret }}
  items:
    - key: {{ $source.key }}
      path: {{ $source.key }}
{{- else -}}
{{- fail (printf "%s: set configMap or secret" .what) -}}
{{- end -}}
{{- end -}}

{{/* The RBAC rules for reading configuration in one namespace (or all, in a ClusterRole). */}}
{{- define "sluice.configRules" -}}
# The configuration: the gateway lists and watches plugins and routes
# (AI model routes and MCP routes).
- apiGroups: [sluice.dev]
  resources: [gatewayplugins, aimodelroutes, mcproutes]
  verbs: [get, list, watch]
# It reports what it serves (digest, observedGeneration) in their status,
# written with server-side apply, which is a patch.
- apiGroups: [sluice.dev]
  resources: [gatewayplugins/status, aimodelroutes/status, mcproutes/status]
  verbs: [get, patch]
# The Secrets that resources point at: a plugin's configFrom and
# pullSecretRef, a backend's apiKeySecretRef. list/watch cannot be limited
# by name, hence namespace-wide read access, and hence namespaced Roles.
- apiGroups: [""]
  resources: [secrets]
  verbs: [get, list, watch]
# Events on plugins and routes (a module refused, a config rejected).
# Repeats of an event are patched into it rather than created anew.
- apiGroups: [events.k8s.io]
  resources: [events]
  verbs: [create, patch]
{{- end -}}

{{- define "sluice.leaseRules" -}}
# Coordination between replicas (--lease-namespace): one leader Lease, and
# one Lease per replica carrying that replica's load report (and more
# Leases for the rest of a report too large for one annotation).
- apiGroups: [coordination.k8s.io]
  resources: [leases]
  # delete: a replica withdraws its report on shutdown, and the leader
  # removes those of replicas long gone.
  verbs: [get, list, watch, create, update, patch, delete]
{{- end -}}
