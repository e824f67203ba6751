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
app.kubernetes.io/managed-by: {{ .Release.Service }}
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
"true" when the bridge reads the cluster's identity, the uid of namespace kube-system, else "":
when it keeps checkpoints somewhere durable (checkpoint.enabled, and a broker sink or a
checkpoint.directory or checkpoint.nats for stdout), which are tied to that identity, or when the audit extensions
are on (config.auditExtensions, default true), whose `clusterid` is that uid.
*/}}
{{- define "kube-event-bridge.readsClusterIdentity" -}}
{{- $enabled := dig "checkpoint" "enabled" true .Values.config }}
{{- $stdout := not (or (dig "sink" "kafka" nil .Values.config) (dig "sink" "nats" nil .Values.config)) }}
{{- $checkpoints := and $enabled (or (not $stdout) (dig "checkpoint" "directory" nil .Values.config) (dig "checkpoint" "nats" nil .Values.config)) }}
{{- if or $checkpoints (dig "auditExtensions" true .Values.config) }}true{{ end }}
{{- end }}

{{/*
"true" when the bridge's config enables leader election, else "".
*/}}
{{- define "kube-event-bridge.sharding" -}}
{{- if dig "sharding" "enabled" false .Values.config }}true{{ end }}
{{- end }}

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
A regular expression matching what the glob `.` matches: `*` is any run of characters (dots
included), everything else literal, as the bridge's config::glob.
*/}}
{{- define "kube-event-bridge.globRegex" -}}
{{- printf "^%s$" (regexQuoteMeta . | replace "\\*" ".*") -}}
{{- end }}

{{/*
"true" when config entry .entry excludes the resource .plural of API group .group, else "":
an exclusion without apiVersion matches any group; with one, its group pattern must match and
its version be "*", the entry's version or (the chart does not know which version discovery
prefers) any when the entry's version is "*". Its resource matches the plural ignoring case,
or as a kind whose plural (see kube-event-bridge.plural) is the plural.
Input: dict "entry" MAP "version" STRING "group" STRING "plural" STRING "plurals" MAP.
*/}}
{{- define "kube-event-bridge.excluded" -}}
{{- $in := . -}}
{{- range $x := ($in.entry.exclude | default list) -}}
{{- $groupOk := true -}}
{{- $versionOk := true -}}
{{- with $x.apiVersion -}}
{{- $xg := "" -}}
{{- $xv := . -}}
{{- if contains "/" . -}}
{{- $xg = regexReplaceAll "/[^/]*$" . "" -}}
{{- $xv = regexReplaceAll "^.*/" . "" -}}
{{- end -}}
{{- $groupOk = regexMatch (include "kube-event-bridge.globRegex" $xg) $in.group -}}
{{- $versionOk = or (eq $xv "*") (eq $in.version "*") (eq $xv $in.version) -}}
{{- end -}}
{{- $name := or (eq (lower $x.resource) $in.plural) (eq (include "kube-event-bridge.plural" (dict "resource" $x.resource "plurals" $in.plurals)) $in.plural) -}}
{{- if and $groupOk $versionOk $name -}}true{{- end -}}
{{- end -}}
{{- end }}

{{/*
The RBAC plan of .Values.config.resources, as YAML:
  cluster:    {API group: [plurals]}                for entries without namespaces (a
              namespaceSelector adds namespaces, a wildcard customresourcedefinitions)
  namespaces: {namespace: {API group: [plurals]}}   for entries with namespaces
A namespace grant the cluster grants already cover is dropped, as src/rbac.rs does.
Every resource is granted by name, never "*" (which in RBAC also matches subresources such as
nodes/proxy and pods/exec, and every resource an exclusion leaves out). The chart cannot ask
discovery what a `resource: "*"` entry matches, so rbac.wildcardResources says what the cluster
serves in each API group ({API group: [plurals]}, as `kube-event-bridge rbac` prints them): the
entry gets those of the groups its group pattern matches, minus its exclusions; a wildcard
matching no group listed there fails the rendering.
*/}}
{{- define "kube-event-bridge.rbacPlan" -}}
{{- $cluster := dict -}}
{{- $namespaces := dict -}}
{{- $plurals := .Values.rbac.plurals | default dict -}}
{{- $served := .Values.rbac.wildcardResources | default dict -}}
{{- $pluralRe := "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$" -}}
{{- range $group, $list := $served -}}
{{- range $p := $list -}}
{{- if not (regexMatch $pluralRe (toString $p)) -}}
{{- fail (printf "rbac.wildcardResources.%s: %q is not the plural name of a resource (no \"*\", no subresources such as pods/log)" $group (toString $p)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $wildcard := false -}}
{{- $selector := false -}}
{{- range $i, $r := required "config.resources is required" .Values.config.resources -}}
{{- $apiVersion := required (printf "config.resources[%d].apiVersion is required" $i) $r.apiVersion -}}
{{- $resource := required (printf "config.resources[%d].resource is required" $i) $r.resource -}}
{{- $group := "" -}}
{{- $version := $apiVersion -}}
{{- if contains "/" $apiVersion -}}
{{- $group = regexReplaceAll "/[^/]*$" $apiVersion "" -}}
{{- $version = regexReplaceAll "^.*/" $apiVersion "" -}}
{{- end -}}
{{- if or (eq $resource "*") (contains "*" $group) (eq $version "*") -}}
{{- $wildcard = true -}}
{{- end -}}
{{- if $r.namespaceSelector -}}
{{- $selector = true -}}
{{- end -}}
{{- /* This entry's grants: a list of [group, plural]. */ -}}
{{- $grants := list -}}
{{- if eq $resource "*" -}}
{{- $re := include "kube-event-bridge.globRegex" $group -}}
{{- $matched := false -}}
{{- range $g, $list := $served -}}
{{- if regexMatch $re $g -}}
{{- $matched = true -}}
{{- range $p := $list -}}
{{- if not (include "kube-event-bridge.excluded" (dict "entry" $r "version" $version "group" $g "plural" $p "plurals" $plurals)) -}}
{{- $grants = append $grants (list $g $p) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if not $matched -}}
{{- fail (printf "config.resources[%d] (apiVersion %s, resource \"*\") is a wildcard: the chart cannot ask discovery what it matches and never grants \"*\" (that would include subresources such as nodes/proxy and pods/exec, and excluded resources such as Secrets); list the resources of its API groups in rbac.wildcardResources (`kube-event-bridge rbac --config FILE` prints them), or set rbac.create=false and apply that output" $i $apiVersion) -}}
{{- end -}}
{{- else if contains "*" $group -}}
{{- fail (printf "config.resources[%d].apiVersion: the group pattern %q needs resource: \"*\"" $i $group) -}}
{{- else -}}
{{- $plural := include "kube-event-bridge.plural" (dict "resource" $resource "plurals" $plurals) -}}
{{- if not (regexMatch $pluralRe $plural) -}}
{{- fail (printf "config.resources[%d].resource: %q resolves to %q, not the plural name of a resource (check rbac.plurals)" $i $resource $plural) -}}
{{- end -}}
{{- $grants = list (list $group $plural) -}}
{{- end -}}
{{- range $gp := $grants -}}
{{- $g := index $gp 0 -}}
{{- $p := index $gp 1 -}}
{{- if $r.namespaces -}}
{{- range $ns := $r.namespaces -}}
{{- if not (hasKey $namespaces $ns) -}}
{{- $_ := set $namespaces $ns dict -}}
{{- end -}}
{{- $inNs := get $namespaces $ns -}}
{{- $_ := set $inNs $g (append (get $inNs $g | default list) $p | uniq | sortAlpha) -}}
{{- end -}}
{{- else -}}
{{- $_ := set $cluster $g (append (get $cluster $g | default list) $p | uniq | sortAlpha) -}}
{{- end -}}
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
Rules granting list and watch (all the bridge does with them) on a {API group: [plurals]} map.
*/}}
{{- define "kube-event-bridge.watchRules" -}}
{{- range $group, $plurals := . }}
- apiGroups: [{{ $group | quote }}]
  resources: {{ toJson $plurals }}
  verbs: ["list", "watch"]
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
