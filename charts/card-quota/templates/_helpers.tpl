{{/* Names are fixed ("card-quota"): webhook configurations and cluster roles are
cluster-wide, one install per cluster, as `card-quota manifests` names them. */}}
{{- define "card-quota.labels" -}}
app.kubernetes.io/name: card-quota
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end }}

{{- define "card-quota.image" -}}
{{ required "image.repository: no card-quota image is published yet; build one (make image), push it to your registry and install with --set image.repository=<registry>/card-quota (docs/install.md, The image)" .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/* The install's card resources (names and `prefix*` patterns), as a YAML list: the
value, or the defaults when a release upgraded with --reuse-values has none. */}}
{{- define "card-quota.cardResources" -}}
{{- toYaml (.Values.cardResources | default (list "nvidia.com/gpu" "nvidia.com/gpu.shared" "nvidia.com/mig-*" "amd.com/gpu" "huawei.com/Ascend*" "huawei.com/npu")) -}}
{{- end }}

{{- define "card-quota.celList" -}}
[{{- range $i, $v := . }}{{ if $i }}, {{ end }}'{{ $v | replace "\\" "\\\\" | replace "'" "\\'" }}'{{ end -}}]
{{- end }}

{{/* The caBundle of the hooks (base64 PEM), for the selfSigned and provided modes. */}}
{{- define "card-quota.caBundle" -}}
{{- if eq .Values.certificates.mode "provided" -}}
{{ required "certificates.caBundle is required when certificates.mode is provided" .Values.certificates.caBundle }}
{{- else if eq .Values.certificates.mode "selfSigned" -}}
{{ (include "card-quota.selfSigned" . | fromYaml).ca }}
{{- end -}}
{{- end }}

{{/* The self-signed CA and serving certificate. The CA of the installed release is
kept (Secret card-quota-ca), so the API server's trust never breaks on upgrade; the
serving certificate is issued again under it at every install and upgrade (a renewal).
Computed once per render and cached. */}}
{{- define "card-quota.selfSigned" -}}
{{- if not (hasKey .Values "__certs") -}}
{{- $ns := .Release.Namespace -}}
{{- $kept := lookup "v1" "Secret" $ns "card-quota-ca" -}}
{{- $caCert := dict -}}
{{- if and $kept $kept.data -}}
{{- $caCert = buildCustomCert (index $kept.data "tls.crt") (index $kept.data "tls.key") -}}
{{- else -}}
{{- $caCert = genCA (printf "card-quota CA (%s)" $ns) 3650 -}}
{{- end -}}
{{- $dns := concat (list "card-quota" (printf "card-quota.%s" $ns) (printf "card-quota.%s.svc" $ns) (printf "card-quota.%s.svc.cluster.local" $ns)) .Values.certificates.extraDNS -}}
{{- $cert := genSignedCert (printf "card-quota.%s.svc" $ns) .Values.certificates.extraIPs $dns (int .Values.certificates.validityDays) $caCert -}}
{{- $_ := set .Values "__certs" (dict "ca" ($caCert.Cert | b64enc) "caKey" ($caCert.Key | b64enc) "crt" ($cert.Cert | b64enc) "key" ($cert.Key | b64enc)) -}}
{{- end -}}
{{- toYaml (get .Values "__certs") -}}
{{- end }}
