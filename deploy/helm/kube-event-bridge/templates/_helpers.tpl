{{/*
The chart's name.
*/}}
{{- define "kube-event-bridge.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The release's full name: the release name alone when it already contains the chart's name.
*/}}
{{- define "kube-event-bridge.fullname" -}}
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

{{- define "kube-event-bridge.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "kube-event-bridge.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kube-event-bridge.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "kube-event-bridge.labels" -}}
helm.sh/chart: {{ include "kube-event-bridge.chart" . }}
{{ include "kube-event-bridge.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end }}

{{- define "kube-event-bridge.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "kube-event-bridge.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
The name of the watch ClusterRole and Roles, as `kube-event-bridge rbac` names them:
kube-event-bridge:<release namespace>:<service account>.
*/}}
{{- define "kube-event-bridge.roleName" -}}
{{- printf "kube-event-bridge:%s:%s" .Release.Namespace (include "kube-event-bridge.serviceAccountName" .) }}
{{- end }}

{{/*
"true" when the bridge's config enables leader election, else "".
*/}}
{{- define "kube-event-bridge.leaderElection" -}}
{{- if dig "leaderElection" "enabled" false .Values.config }}true{{ end }}
{{- end }}

{{/*
The port of the bridge's admin server (config.admin.address, default 0.0.0.0:8080).
*/}}
{{- define "kube-event-bridge.adminPort" -}}
{{- dig "admin" "address" "0.0.0.0:8080" .Values.config | splitList ":" | last }}
{{- end }}

{{/*
The plural resource name of one config entry's `resource`: as written when it starts with a
lowercase letter (a plural), else (a kind) from rbac.plurals or guessed: lowercase, then "es"
after s/x/z/ch/sh, "ies" for a consonant + y, else "s" ("endpoints" stays).
Input: dict "resource" STRING "plurals" MAP.
*/}}
{{- define "kube-event-bridge.plural" -}}
{{- $r := .resource -}}
{{- if hasKey .plurals $r -}}
{{- get .plurals $r -}}
{{- else if regexMatch "^[A-Z]" $r -}}
{{- $l := lower $r -}}
{{- if hasSuffix "endpoints" $l -}}
{{- $l -}}
{{- else if regexMatch "(s|x|z|ch|sh)$" $l -}}
{{- printf "%ses" $l -}}
{{- else if regexMatch "[^aeiou]y$" $l -}}
{{- printf "%sies" (trimSuffix "y" $l) -}}
{{- else -}}
{{- printf "%ss" $l -}}
{{- end -}}
{{- else -}}
{{- $r -}}
{{- end -}}
{{- end }}

{{/*
The RBAC plan of .Values.config.resources, as YAML:
  cluster:    {API group: [plurals]}                for entries without namespaces (a
              namespaceSelector adds namespaces, a wildcard customresourcedefinitions; resource
              "*" is granted as "*" in its group)
  namespaces: {namespace: {API group: [plurals]}}   for entries with namespaces
A namespace grant the cluster grants already cover is dropped, as src/rbac.rs does.
*/}}
{{- define "kube-event-bridge.rbacPlan" -}}
{{- $cluster := dict -}}
{{- $namespaces := dict -}}
{{- $plurals := .Values.rbac.plurals | default dict -}}
{{- $wildcard := false -}}
{{- $selector := false -}}
{{- range $i, $r := required "config.resources is required" .Values.config.resources -}}
{{- $apiVersion := required (printf "config.resources[%d].apiVersion is required" $i) $r.apiVersion -}}
{{- $group := "" -}}
{{- if contains "/" $apiVersion -}}
{{- $group = first (splitList "/" $apiVersion) -}}
{{- end -}}
{{- if contains "*" $group -}}
{{- fail (printf "config.resources[%d].apiVersion: the group pattern %q cannot be expressed in RBAC; list the groups, or set rbac.create=false and grant what `kube-event-bridge rbac` renders" $i $group) -}}
{{- end -}}
{{- if or (eq $r.resource "*") (hasSuffix "/*" $apiVersion) (eq $apiVersion "*") -}}
{{- $wildcard = true -}}
{{- end -}}
{{- if $r.namespaceSelector -}}
{{- $selector = true -}}
{{- end -}}
{{- $plural := include "kube-event-bridge.plural" (dict "resource" (required (printf "config.resources[%d].resource is required" $i) $r.resource) "plurals" $plurals) -}}
{{- if $r.namespaces -}}
{{- range $ns := $r.namespaces -}}
{{- if not (hasKey $namespaces $ns) -}}
{{- $_ := set $namespaces $ns dict -}}
{{- end -}}
{{- $grants := get $namespaces $ns -}}
{{- $_ := set $grants $group (append (get $grants $group | default list) $plural | uniq | sortAlpha) -}}
{{- end -}}
{{- else -}}
{{- $_ := set $cluster $group (append (get $cluster $group | default list) $plural | uniq | sortAlpha) -}}
{{- end -}}
{{- end -}}
{{- if $selector -}}
{{- $_ := set $cluster "" (append (get $cluster "" | default list) "namespaces" | uniq | sortAlpha) -}}
{{- end -}}
{{- if $wildcard -}}
{{- $_ := set $cluster "apiextensions.k8s.io" (append (get $cluster "apiextensions.k8s.io" | default list) "customresourcedefinitions" | uniq | sortAlpha) -}}
{{- end -}}
{{- range $ns, $grants := $namespaces -}}
{{- range $group, $list := $grants -}}
{{- $everywhere := get $cluster $group | default list -}}
{{- $left := list -}}
{{- range $p := $list -}}
{{- if not (has $p $everywhere) -}}
{{- $left = append $left $p -}}
{{- end -}}
{{- end -}}
{{- if $left -}}
{{- $_ := set $grants $group $left -}}
{{- else -}}
{{- $_ := unset $grants $group -}}
{{- end -}}
{{- end -}}
{{- if not $grants -}}
{{- $_ := unset $namespaces $ns -}}
{{- end -}}
{{- end -}}
{{- toYaml (dict "cluster" $cluster "namespaces" $namespaces) -}}
{{- end }}

{{/*
Rules granting get, list, watch on a {API group: [plurals]} map.
*/}}
{{- define "kube-event-bridge.watchRules" -}}
{{- range $group, $plurals := . }}
- apiGroups: [{{ $group | quote }}]
  resources: {{ toJson $plurals }}
  verbs: ["get", "list", "watch"]
{{- end }}
{{- end }}

{{/*
Fails on a configuration the chart must not deploy: more than one sink (Helm merges the sink
maps of several values files), an admin server on loopback (unreachable for probes), a secret
written inline in Kafka properties, or a credential file (NATS credentials, Kafka *.location
properties and propertyFiles) outside every secretMounts path.
*/}}
{{- define "kube-event-bridge.checkConfig" -}}
{{- $sink := .Values.config.sink | default dict -}}
{{- $sinks := list -}}
{{- range $k, $v := $sink -}}
{{- if not (kindIs "invalid" $v) -}}
{{- $sinks = append $sinks $k -}}
{{- end -}}
{{- end -}}
{{- if gt (len $sinks) 1 -}}
{{- fail (printf "config.sink has %s: set exactly one sink (Helm merges the sink maps of all values files; set the others to null)" (join ", " $sinks)) -}}
{{- end -}}
{{- $admin := dig "admin" "address" "0.0.0.0:8080" .Values.config -}}
{{- if regexMatch "^(127\\.|localhost:|\\[::1\\]:)" $admin -}}
{{- fail (printf "config.admin.address %s is a loopback address: the kubelet probes the pod's IP (use 0.0.0.0:PORT)" $admin) -}}
{{- end -}}
{{- $files := list -}}
{{- with $sink.nats -}}
{{- range $k, $v := (.credentials | default dict) -}}
{{- if and $v (hasSuffix "File" $k) -}}
{{- $files = append $files (list (printf "config.sink.nats.credentials.%s" $k) $v) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- with $sink.kafka -}}
{{- range $k, $v := (.properties | default dict) -}}
{{- if has $k (list "sasl.password" "ssl.key.password" "ssl.keystore.password" "ssl.key.pem" "ssl.certificate.pem" "sasl.oauthbearer.client.secret" "sasl.oauthbearer.config") -}}
{{- fail (printf "config.sink.kafka.properties.%s would write a secret into the ConfigMap; read it from a secretMounts file with config.sink.kafka.propertyFiles.%s (or ssl.*.location) instead" $k $k) -}}
{{- end -}}
{{- if and $v (hasSuffix ".location" $k) -}}
{{- $files = append $files (list (printf "config.sink.kafka.properties.%s" $k) $v) -}}
{{- end -}}
{{- end -}}
{{- range $k, $v := (.propertyFiles | default dict) -}}
{{- $files = append $files (list (printf "config.sink.kafka.propertyFiles.%s" $k) $v) -}}
{{- end -}}
{{- end -}}
{{- $mounts := .Values.secretMounts | default list -}}
{{- range $f := $files -}}
{{- $found := false -}}
{{- range $m := $mounts -}}
{{- if hasPrefix (printf "%s/" (trimSuffix "/" $m.mountPath)) (index $f 1) -}}
{{- $found = true -}}
{{- end -}}
{{- end -}}
{{- if not $found -}}
{{- fail (printf "%s: %s is not under any secretMounts[].mountPath; mount the Secret that holds it" (index $f 0) (index $f 1)) -}}
{{- end -}}
{{- end -}}
{{- end }}
