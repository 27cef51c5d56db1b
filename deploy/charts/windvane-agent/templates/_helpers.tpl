{{- /*
The documents of one file of files/ (links to deploy/agent), as a JSON list of objects: the chart starts from
the very files the kustomize base installs, and changes only what the values ask for.
Call: include "windvane.docs" (dict "root" $ "file" "base/rbac.yaml") | fromJsonArray
*/ -}}
{{- define "windvane.docs" -}}
{{- $docs := list -}}
{{- range regexSplit "(?m)^---[ \t]*$" (.root.Files.Get (printf "files/%s" .file)) -1 -}}
{{- $doc := fromYaml . -}}
{{- if and $doc (hasKey $doc "kind") -}}
{{- $docs = append $docs $doc -}}
{{- end -}}
{{- end -}}
{{- toJson $docs -}}
{{- end -}}

{{- /*
Labels every object gets, as the kustomize base's `labels:` adds them (metadata only), and commonLabels.
Call: include "windvane.label" (dict "object" $doc "values" .Values)
*/ -}}
{{- define "windvane.label" -}}
{{- $meta := .object.metadata -}}
{{- $labels := merge (dict "app.kubernetes.io/part-of" "windvane") (default dict $meta.labels) -}}
{{- $_ := set $meta "labels" (mergeOverwrite $labels .values.commonLabels) -}}
{{- end -}}
