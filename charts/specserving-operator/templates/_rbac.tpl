{{/*
The operator's namespaced permissions, each rule with its reason. Used by the ClusterRole (all namespaces) or a
Role per watched namespace. Every child is written with server-side apply (PATCH; create when it does not exist
yet) and pruned with DELETE; nothing is written with PUT, so no rule grants update except the finalizers one.
Secrets are not readable by default: build push secrets and image pull secrets are referenced by name in pod
specs. Only build.readPullSecrets grants get (no list, no watch), for the pull secrets a SpecServing names, to
resolve a private base image's digest.
*/}}
{{- define "specserving-operator.namespacedRules" -}}
# kopf lists and watches SpecServings and keeps its handler progress in annotations under
# operator.specserving.io/ (patch). No finalizer is ever added.
- apiGroups: ["specserving.io"]
  resources: ["specservings"]
  verbs: ["get", "list", "watch", "patch"]
# Observed state, written only through the status subresource (JSON merge patch).
- apiGroups: ["specserving.io"]
  resources: ["specservings/status"]
  verbs: ["patch"]
# Children's ownerReferences set blockOwnerDeletion; where the OwnerReferencesPermissionEnforcement admission
# plugin is on, that needs update on the owner's finalizers subresource.
- apiGroups: ["specserving.io"]
  resources: ["specservings/finalizers"]
  verbs: ["update"]
# The pools' and router's workloads: applied (create, patch), watched for status, pruned when no longer rendered.
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# Multi-node replicas (nodesPerReplica > 1) run as LeaderWorkerSets.
- apiGroups: ["leaderworkerset.x-k8s.io"]
  resources: ["leaderworkersets"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# Pool and router Services, and the router's ServiceAccount.
- apiGroups: [""]
  resources: ["services", "serviceaccounts"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# An image build's context ConfigMap, applied once beside its Job and owned by it (the Job's TTL removes both);
# never read back.
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["create", "patch"]
# Pool PodDisruptionBudgets.
- apiGroups: ["policy"]
  resources: ["poddisruptionbudgets"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# The router's Role and RoleBinding (read pods for service discovery). Granting a Role requires holding its
# permissions, which the pods rule below provides; no escalate or bind verbs are needed, so the operator can
# never grant more than it holds.
- apiGroups: ["rbac.authorization.k8s.io"]
  resources: ["roles", "rolebindings"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# Watch pool pods for readiness and crash reasons; patch the decode pods' pod-deletion-cost before a scale-down.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch", "patch"]
# In-cluster builds of the fixed serving image: one shared Job per build, applied, then watched for the digest
# its pod reports. Their TTL removes finished Jobs; the operator deletes none.
- apiGroups: ["batch"]
  resources: ["jobs"]
  verbs: ["get", "list", "watch", "create", "patch"]
# ServiceMonitors, rendered only when a SpecServing asks for them.
- apiGroups: ["monitoring.coreos.com"]
  resources: ["servicemonitors"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
{{- if .Values.build.readPullSecrets }}
# build.readPullSecrets: read the pull secrets a SpecServing names (spec.image.pullSecrets), to resolve its base
# tag to a digest before a build. Never listed or watched, never logged or copied.
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["get"]
{{- end }}
# core/v1 Events on the SpecServing (the operator's transitions and kopf's own), for kubectl describe.
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
{{- end -}}
