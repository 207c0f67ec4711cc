{{/*
Names and labels.
*/}}
{{- define "sluice.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
The full name prefixes every pod name, and so every SLUICE_INSTANCE_ID
(<fullname>-<ordinal>). StatefulSet pod names must leave room for the
ordinal and the controller-revision-hash label: 52 characters.
*/}}
{{- define "sluice.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 52 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 52 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 52 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "sluice.selectorLabels" -}}
app.kubernetes.io/name: {{ include "sluice.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "sluice.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "sluice.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: processor
{{- end -}}

{{- define "sluice.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "sluice.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/*
The Secret the pods read, "" for none.
*/}}
{{- define "sluice.secretName" -}}
{{- if .Values.secret.existingSecret -}}
{{- .Values.secret.existingSecret -}}
{{- else if .Values.secret.create -}}
{{- include "sluice.fullname" . -}}
{{- end -}}
{{- end -}}

{{/*
sluice.seconds: a Go duration as SLUICE_* variables take it ("100ms",
"1m30s", "0") in seconds, as a decimal number.
*/}}
{{- define "sluice.seconds" -}}
{{- $d := toString . | trim -}}
{{- $num := "([0-9]+(\\.[0-9]*)?|\\.[0-9]+)" -}}
{{- $unit := "(ns|us|µs|μs|ms|s|m|h)" -}}
{{- if not (or (eq $d "0") (regexMatch (printf "^(%s%s)+$" $num $unit) $d)) -}}
{{- fail (printf "%q is not a Go duration such as 100ms, 10s or 1m30s" $d) -}}
{{- end -}}
{{- $scale := dict "ns" 0.000000001 "us" 0.000001 "µs" 0.000001 "μs" 0.000001 "ms" 0.001 "s" 1.0 "m" 60.0 "h" 3600.0 -}}
{{- $total := 0.0 -}}
{{- range regexFindAll (printf "%s%s" $num $unit) $d -1 -}}
{{- $n := regexFind (printf "^%s" $num) . -}}
{{- $total = addf $total (mulf (float64 $n) (get $scale (trimPrefix $n .))) -}}
{{- end -}}
{{- $total -}}
{{- end -}}

{{/*
The processor's own derivations (cmd/processor/config.go), from env: the
epoch is the longer of SLUICE_CHECKPOINT_INTERVAL (default 100ms) and
SLUICE_MIN_PAUSE (default 0); the transaction timeout is
SLUICE_TRANSACTION_TIMEOUT or max(10s, 10 x epoch); the checkpoint timeout
is SLUICE_CHECKPOINT_TIMEOUT or the transaction timeout minus the epoch.
A Go test renders the chart and compares these with the binary's.
*/}}
{{- define "sluice.epochSeconds" -}}
{{- $env := default dict .Values.env -}}
{{- $interval := include "sluice.seconds" (default "100ms" (get $env "SLUICE_CHECKPOINT_INTERVAL")) | float64 -}}
{{- $pause := include "sluice.seconds" (default "0s" (get $env "SLUICE_MIN_PAUSE")) | float64 -}}
{{- maxf $interval $pause -}}
{{- end -}}

{{- define "sluice.transactionTimeoutSeconds" -}}
{{- $env := default dict .Values.env -}}
{{- $tx := maxf 10.0 (mulf 10 (include "sluice.epochSeconds" . | float64)) -}}
{{- with get $env "SLUICE_TRANSACTION_TIMEOUT" -}}
{{- $set := include "sluice.seconds" . | float64 -}}
{{- if gt $set 0.0 -}}{{- $tx = $set -}}{{- end -}}
{{- end -}}
{{- $tx -}}
{{- end -}}

{{- define "sluice.checkpointTimeoutSeconds" -}}
{{- $env := default dict .Values.env -}}
{{- $ck := subf (include "sluice.transactionTimeoutSeconds" . | float64) (include "sluice.epochSeconds" . | float64) -}}
{{- with get $env "SLUICE_CHECKPOINT_TIMEOUT" -}}
{{- $set := include "sluice.seconds" . | float64 -}}
{{- if gt $set 0.0 -}}{{- $ck = $set -}}{{- end -}}
{{- end -}}
{{- $ck -}}
{{- end -}}

{{/*
terminationGracePeriodSeconds: the final checkpoint (the checkpoint
timeout), then leaving the group (the engine gives it 5s), then closing.
*/}}
{{- define "sluice.terminationGracePeriodSeconds" -}}
{{- $ck := include "sluice.checkpointTimeoutSeconds" . | float64 -}}
{{- $least := addf $ck 5 -}}
{{- $g := .Values.terminationGracePeriod -}}
{{- if $g.seconds -}}
{{- if lt (float64 $g.seconds) $least -}}
{{- fail (printf "terminationGracePeriod.seconds=%v is shorter than the final checkpoint may take: the checkpoint timeout (%vs) plus 5s to leave the group" $g.seconds $ck) -}}
{{- end -}}
{{- $g.seconds | int -}}
{{- else -}}
{{- if lt (float64 $g.marginSeconds) 5.0 -}}
{{- fail (printf "terminationGracePeriod.marginSeconds=%v: expected at least 5, the time the processor may take to leave the group" $g.marginSeconds) -}}
{{- end -}}
{{- addf $ck $g.marginSeconds | ceil | int -}}
{{- end -}}
{{- end -}}

{{/*
sluice.validate fails the render on values the processor or the chart
cannot work with; it renders nothing.
*/}}
{{- define "sluice.validate" -}}
{{- $env := default dict .Values.env -}}
{{- range $k := list "SLUICE_BROKERS" "SLUICE_APP_ID" "SLUICE_JOB" "SLUICE_INPUT_TOPICS" -}}
{{- if not (get $env $k) -}}
{{- fail (printf "env.%s is required (README.md, Configuration reference)" $k) -}}
{{- end -}}
{{- end -}}
{{- range $k := list "SLUICE_INSTANCE_ID" "SLUICE_STATE_DIR" "SLUICE_METRICS_ADDR" -}}
{{- if hasKey $env $k -}}
{{- fail (printf "env.%s is set by the chart (instance id = pod name, state dir = the volume, metrics address = metrics.port); remove it" $k) -}}
{{- end -}}
{{- end -}}
{{- range $k := $.Values.secret.envKeys -}}
{{- if hasKey $env $k -}}
{{- fail (printf "env.%s is a secret: put it in the Secret (secret.existingSecret or secret.values), not in env" $k) -}}
{{- end -}}
{{- end -}}
{{- range $k, $v := $env -}}
{{- if not (hasPrefix "SLUICE_" $k) -}}
{{- fail (printf "env.%s: env takes SLUICE_* variables; put other variables in extraEnv" $k) -}}
{{- end -}}
{{- end -}}
{{- if contains "," (toString (get $env "SLUICE_INPUT_TOPICS")) -}}
{{- fail "env.SLUICE_INPUT_TOPICS: one input topic (the processor has no co-partitioning assignor yet)" -}}
{{- end -}}
{{- if lt (int .Values.partitions) 1 -}}
{{- fail "partitions: expected the input topic's partition count, 1 or more" -}}
{{- end -}}
{{- if .Values.autoscaling.enabled -}}
{{- $min := int .Values.autoscaling.minReplicas -}}
{{- if or (lt $min 1) (gt $min (int .Values.partitions)) -}}
{{- fail (printf "autoscaling.minReplicas=%d: expected 1 to partitions (%d); timers and TTL sweeps need a running instance" $min (int .Values.partitions)) -}}
{{- end -}}
{{- end -}}
{{- if and .Values.secret.create .Values.secret.existingSecret -}}
{{- fail "secret.create and secret.existingSecret: choose one" -}}
{{- end -}}
{{- end -}}
