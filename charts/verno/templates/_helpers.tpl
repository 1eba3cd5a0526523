{{- define "verno.labels" -}}
app.kubernetes.io/name: verno
app.kubernetes.io/part-of: verno
app.kubernetes.io/component: admission-controller
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end }}

{{- define "verno.selector" -}}
app.kubernetes.io/name: verno
app.kubernetes.io/component: admission-controller
{{- end }}

{{- define "verno.excluded" -}}
{{- $ns := concat (list "kube-system" "kube-public" "kube-node-lease" .Release.Namespace) .Values.config.excludedNamespaces | uniq | sortAlpha -}}
{{- toJson $ns -}}
{{- end }}

{{/* One webhook entry: everything but rules and caBundle, which Verno owns. */}}
{{- define "verno.webhook" -}}
- name: {{ .name }}
  clientConfig:
    service:
      name: verno-svc
      namespace: {{ .root.Release.Namespace }}
      path: {{ .path }}
      port: 443
  failurePolicy: {{ if .fail }}Fail{{ else }}Ignore{{ end }}
  timeoutSeconds: {{ if .fail }}{{ .root.Values.config.webhooks.failTimeoutSeconds }}{{ else }}{{ .root.Values.config.webhooks.ignoreTimeoutSeconds }}{{ end }}
  sideEffects: NoneOnDryRun
  admissionReviewVersions: ["v1"]
  matchPolicy: Equivalent
  namespaceSelector:
    matchExpressions:
    - key: kubernetes.io/metadata.name
      operator: NotIn
      values: {{ include "verno.excluded" .root }}
    - key: verno.io/ignore
      operator: DoesNotExist
    {{- with .root.Values.config.webhooks.namespaceSelector }}
    {{- with .matchExpressions }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
    {{- with .matchLabels }}
    matchLabels:
      {{- toYaml . | nindent 6 }}
    {{- end }}
    {{- end }}
  {{- with .root.Values.config.webhooks.objectSelector }}
  objectSelector:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  matchConditions:
  - name: exclude-nodes-and-csrs
    expression: "!(request.resource.group == '' && request.resource.resource == 'nodes') && !(request.resource.group == 'certificates.k8s.io' && request.resource.resource == 'certificatesigningrequests')"
  - name: exclude-leases
    expression: "!(request.resource.group == 'coordination.k8s.io' && request.resource.resource == 'leases')"
  - name: exclude-events
    expression: "!(request.resource.resource == 'events')"
  - name: exclude-verno-service-accounts
    expression: "!request.userInfo.username.startsWith('system:serviceaccount:{{ .root.Release.Namespace }}:')"
  {{- with .root.Values.config.matchConditions }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- end }}

{{- define "verno.policyWebhook" -}}
- name: validate-policy.kyverno.svc
  clientConfig:
    service:
      name: {{ .service }}
      namespace: {{ .root.Release.Namespace }}
      path: /policyvalidate
      port: 443
  failurePolicy: Ignore
  timeoutSeconds: {{ .root.Values.config.webhooks.ignoreTimeoutSeconds }}
  sideEffects: None
  admissionReviewVersions: ["v1"]
  matchPolicy: Equivalent
{{- end }}

{{- define "verno.monitorWebhook" -}}
- name: monitor-webhooks.kyverno.svc
  clientConfig:
    service:
      name: {{ .service }}
      namespace: {{ .root.Release.Namespace }}
      path: /verifymutate
      port: 443
  failurePolicy: Ignore
  timeoutSeconds: {{ .root.Values.config.webhooks.ignoreTimeoutSeconds }}
  sideEffects: None
  admissionReviewVersions: ["v1"]
  matchPolicy: Equivalent
  namespaceSelector:
    matchLabels:
      kubernetes.io/metadata.name: {{ .root.Release.Namespace }}
  objectSelector:
    matchLabels:
      verno.io/probe: "true"
{{- end }}
