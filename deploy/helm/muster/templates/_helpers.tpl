{{/*
Names, labels and the generated configuration shared by the templates.
Every pod reads one YAML config file from the ConfigMap; credentials never enter it: the config
names files that are mounted from Secrets (see deploy/README.md, "Daemon configuration").
*/}}

{{- define "muster.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "muster.fullname" -}}
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

{{- define "muster.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Selector labels; call with (dict "ctx" $ "component" "daemon"). */}}
{{- define "muster.selectorLabels" -}}
app.kubernetes.io/name: {{ include "muster.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/* Common labels; call with (dict "ctx" $ "component" "daemon"). */}}
{{- define "muster.labels" -}}
helm.sh/chart: {{ include "muster.chart" .ctx }}
{{ include "muster.selectorLabels" . }}
app.kubernetes.io/version: {{ .ctx.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
app.kubernetes.io/part-of: muster
{{- end }}

{{- define "muster.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "muster.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The account of pods that talk only to NATS (billing, queues apply): no RBAC, no token. */}}
{{- define "muster.clientServiceAccountName" -}}
{{- printf "%s-client" (include "muster.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "muster.leaseName" -}}
{{- default (printf "%s-leader" (include "muster.fullname" .)) .Values.leaderElection.leaseName | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "muster.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/*
The NATS URL: with nats.install, the Service of the bundled nats chart (named like that chart's
"nats.fullname": the release name, suffixed with "-nats" unless it already contains "nats");
otherwise nats.url.
*/}}
{{- define "muster.natsUrl" -}}
{{- if .Values.nats.install }}
{{- $svc := "" }}
{{- if .Values.nats.fullnameOverride }}
{{- $svc = .Values.nats.fullnameOverride }}
{{- else if contains "nats" .Release.Name }}
{{- $svc = .Release.Name }}
{{- else }}
{{- $svc = printf "%s-nats" .Release.Name }}
{{- end }}
{{- printf "nats://%s.%s.svc:4222" ($svc | trunc 63 | trimSuffix "-") .Release.Namespace }}
{{- else }}
{{- required "nats.url is required unless nats.install is true" .Values.nats.url }}
{{- end }}
{{- end }}

{{/*
The `nats:` block of a component's config; call with (dict "ctx" $ "identity" "muster-daemon").
Paths point into the Secret volumes mounted by "muster.natsVolumeMounts".
*/}}
{{- define "muster.natsConfig" -}}
{{- $v := .ctx.Values.nats }}
{{- $nats := dict "url" (include "muster.natsUrl" .ctx) "stream" $v.stream "subject_prefix" $v.subjectPrefix "inbox_prefix" (printf "%s.%s" $v.inboxPrefix .identity) "max_event_bytes" (int .ctx.Values.daemon.maxEventBytes) }}
{{- $auth := dict }}
{{- if eq $v.auth.type "userPassword" }}
{{- $auth = dict "username_file" "/etc/muster/nats-auth/username" "password_file" "/etc/muster/nats-auth/password" }}
{{- else if eq $v.auth.type "token" }}
{{- $auth = dict "token_file" "/etc/muster/nats-auth/token" }}
{{- else if eq $v.auth.type "nkey" }}
{{- $auth = dict "nkey_seed_file" "/etc/muster/nats-auth/nkey.seed" }}
{{- else if eq $v.auth.type "creds" }}
{{- $auth = dict "creds_file" "/etc/muster/nats-auth/nats.creds" }}
{{- end }}
{{- if $auth }}
{{- $_ := set $nats "auth" $auth }}
{{- end }}
{{- if $v.tls.enabled }}
{{- $tls := dict "ca_file" "/etc/muster/nats-tls/ca.crt" }}
{{- if $v.tls.certKey }}
{{- $_ := set $tls "cert_file" "/etc/muster/nats-tls/tls.crt" }}
{{- $_ := set $tls "key_file" "/etc/muster/nats-tls/tls.key" }}
{{- end }}
{{- if $v.tls.serverName }}
{{- $_ := set $tls "server_name" $v.tls.serverName }}
{{- end }}
{{- $_ := set $nats "tls" $tls }}
{{- end }}
{{- toYaml (dict "nats" $nats) }}
{{- end }}

{{/* Volumes with NATS credentials; call with (dict "ctx" $ "secret" "name-or-empty"). */}}
{{- define "muster.natsVolumes" -}}
{{- $v := .ctx.Values.nats }}
{{- if ne $v.auth.type "none" }}
{{- $items := list }}
{{- if eq $v.auth.type "userPassword" }}
{{- $items = list (dict "key" $v.auth.usernameKey "path" "username") (dict "key" $v.auth.passwordKey "path" "password") }}
{{- else if eq $v.auth.type "token" }}
{{- $items = list (dict "key" $v.auth.tokenKey "path" "token") }}
{{- else if eq $v.auth.type "nkey" }}
{{- $items = list (dict "key" $v.auth.nkeySeedKey "path" "nkey.seed") }}
{{- else if eq $v.auth.type "creds" }}
{{- $items = list (dict "key" $v.auth.credsKey "path" "nats.creds") }}
{{- end }}
- name: nats-auth
  secret:
    secretName: {{ required "nats.auth.existingSecret is required when nats.auth.type is not none" (default $v.auth.existingSecret .secret) }}
    defaultMode: 0440
    items:
      {{- toYaml $items | nindent 6 }}
{{- end }}
{{- if $v.tls.enabled }}
{{- $items := list (dict "key" $v.tls.caKey "path" "ca.crt") }}
{{- if $v.tls.certKey }}
{{- $items = append $items (dict "key" $v.tls.certKey "path" "tls.crt") }}
{{- $items = append $items (dict "key" $v.tls.keyKey "path" "tls.key") }}
{{- end }}
- name: nats-tls
  secret:
    secretName: {{ required "nats.tls.existingSecret is required when nats.tls.enabled" $v.tls.existingSecret }}
    defaultMode: 0440
    items:
      {{- toYaml $items | nindent 6 }}
{{- end }}
{{- end }}

{{- define "muster.natsVolumeMounts" -}}
{{- if ne .Values.nats.auth.type "none" }}
- name: nats-auth
  mountPath: /etc/muster/nats-auth
  readOnly: true
{{- end }}
{{- if .Values.nats.tls.enabled }}
- name: nats-tls
  mountPath: /etc/muster/nats-tls
  readOnly: true
{{- end }}
{{- end }}

{{/* Environment every muster container gets: who it is, for leader election and logs. */}}
{{- define "muster.podEnv" -}}
- name: POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
- name: POD_NAMESPACE
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
{{- end }}

{{/* The daemon's config.yaml (deploy/README.md, "Daemon configuration"). */}}
{{- define "muster.daemonConfig" -}}
{{- $le := dict "backend" .Values.leaderElection.backend "ttl_seconds" (int .Values.leaderElection.ttlSeconds) }}
{{- if eq .Values.leaderElection.backend "lease" }}
{{- $_ := set $le "lease_name" (include "muster.leaseName" .) }}
{{- $_ := set $le "lease_namespace" .Release.Namespace }}
{{- else }}
{{- $_ := set $le "kv_bucket" .Values.leaderElection.kvBucket }}
{{- end }}
{{- $u := .Values.daemon.utilization }}
{{- $k8s := dict "scheduler_name" .Values.schedulerName "namespaces" .Values.daemon.namespaces "pod_conditions" .Values.podConditions "events" .Values.events "workload_status" .Values.workloadStatus }}
{{- if hasKey .Values "bindConnections" }}
{{- $_ := set $k8s "bind_connections" (int .Values.bindConnections) }}
{{- end }}
{{- $cfg := dict
  "leader_election" $le
  "kubernetes" $k8s
  "utilization" (dict "url" $u.url "source" $u.source "interval_seconds" (int $u.intervalSeconds))
  "http" (dict "health_port" (int .Values.ports.health) "metrics_port" (int .Values.ports.metrics))
  "log" (dict "level" .Values.daemon.logLevel "format" "json")
  "queues_file" "/etc/muster/queues.yaml"
}}
{{- if .Values.ui.enabled }}
{{- if .Values.ui.tokenSecret }}
{{- $_ := set $cfg "ui" (dict "port" (int .Values.ui.port) "host" "0.0.0.0" "token_file" "/etc/muster/ui/token") }}
{{- else }}
{{- $_ := set $cfg "ui" (dict "port" (int .Values.ui.port) "host" "127.0.0.1") }}
{{- end }}
{{- end }}
{{- if .Values.archive.enabled }}
{{- $a := .Values.archive }}
{{- $archive := dict "segment_events" (int $a.segmentEvents) "interval_seconds" (int $a.intervalSeconds) "consumers" $a.consumers "state_every_events" (int $a.stateEveryEvents) }}
{{- if $a.bucket }}
{{- $_ := set $archive "bucket" $a.bucket }}
{{- else }}
{{- $_ := set $archive "directory" $a.mountPath }}
{{- end }}
{{- $_ := set $cfg "archive" $archive }}
{{- end }}
{{- $_ := set $cfg "retention" (dict "max_age_seconds" (int .Values.retention.maxAgeSeconds) "max_bytes" (int64 .Values.retention.maxBytes) "ceiling_factor" .Values.retention.ceilingFactor) }}
{{- $cfg = mustMergeOverwrite $cfg (include "muster.natsConfig" (dict "ctx" . "identity" "muster-daemon") | fromYaml) }}
{{- $cfg = mustMergeOverwrite $cfg (deepCopy .Values.daemon.extraConfig) }}
{{- toYaml $cfg }}
{{- end }}

{{/* The billing subscriber's billing.yaml. */}}
{{- define "muster.billingConfig" -}}
{{- $cfg := dict
  "billing" (dict "consumer" .Values.billing.consumer "data_dir" "/var/lib/muster")
  "http" (dict "health_port" (int .Values.ports.health) "metrics_port" (int .Values.ports.metrics))
  "log" (dict "level" .Values.daemon.logLevel "format" "json")
}}
{{- $cfg = mustMergeOverwrite $cfg (include "muster.natsConfig" (dict "ctx" . "identity" "muster-billing") | fromYaml) }}
{{- $cfg = mustMergeOverwrite $cfg (deepCopy .Values.billing.extraConfig) }}
{{- toYaml $cfg }}
{{- end }}

{{/* The config of `muster queues apply` (the admin identity). */}}
{{- define "muster.adminConfig" -}}
{{- $cfg := dict "log" (dict "level" .Values.daemon.logLevel "format" "json") }}
{{- $cfg = mustMergeOverwrite $cfg (include "muster.natsConfig" (dict "ctx" . "identity" "muster-admin") | fromYaml) }}
{{- toYaml $cfg }}
{{- end }}

{{/* Fail early, with a sentence, on combinations that cannot work. */}}
{{- define "muster.validate" -}}
{{- if and (not .Values.nats.install) (not .Values.nats.url) }}
{{- fail "set nats.url to your NATS, or nats.install=true to install one" }}
{{- end }}
{{- if and .Values.archive.enabled (not .Values.archive.claimName) (not .Values.archive.bucket) }}
{{- fail "archive.enabled needs archive.bucket (a JetStream object store) or archive.claimName (a ReadWriteMany PersistentVolumeClaim every replica mounts)" }}
{{- end }}
{{- if and .Values.archive.claimName .Values.archive.bucket }}
{{- fail "archive: set bucket or claimName, not both" }}
{{- end }}
{{- if and (or .Values.retention.maxAgeSeconds .Values.retention.maxBytes) (not .Values.archive.enabled) }}
{{- fail "retention bounds the stream: set archive.enabled, or its past is lost to replay and audit" }}
{{- end }}
{{- if not (has .Values.leaderElection.backend (list "nats-kv" "lease")) }}
{{- fail "leaderElection.backend must be nats-kv or lease" }}
{{- end }}
{{- if and .Values.podDisruptionBudget.enabled (gt (int .Values.replicaCount) 1) (not (kindIs "string" .Values.podDisruptionBudget.minAvailable)) (ge (int .Values.podDisruptionBudget.minAvailable) (int .Values.replicaCount)) }}
{{- fail "podDisruptionBudget.minAvailable must be below replicaCount, or no node could ever be drained" }}
{{- end }}
{{- if and .Values.nats.tls.enabled .Values.nats.tls.certKey (not .Values.nats.tls.keyKey) }}
{{- fail "nats.tls.keyKey is required with nats.tls.certKey (mutual TLS)" }}
{{- end }}
{{- end }}
