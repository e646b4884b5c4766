{{/*
The operator's namespaced permissions, each rule with its reason. Used by the ClusterRole (all namespaces) or a
Role per watched namespace. There is deliberately no access to Secrets: build push secrets and image pull
secrets are referenced by name in pod specs, never read.
*/}}
{{- define "specserving-operator.namespacedRules" -}}
# Read SpecServings, and patch them for kopf's finalizer-free progress annotations.
- apiGroups: ["specserving.io"]
  resources: ["specservings"]
  verbs: ["get", "list", "watch", "patch"]
# Write observed state through the status subresource only.
- apiGroups: ["specserving.io"]
  resources: ["specservings/status"]
  verbs: ["get", "patch", "update"]
# The pools' and router's workloads, applied with server-side apply and pruned when no longer rendered.
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["get", "list", "watch", "create", "patch", "update", "delete"]
# Multi-node replicas (nodesPerReplica > 1) run as LeaderWorkerSets.
- apiGroups: ["leaderworkerset.x-k8s.io"]
  resources: ["leaderworkersets"]
  verbs: ["get", "list", "watch", "create", "patch", "update", "delete"]
# Pool Services, the router's ServiceAccount, and build-context ConfigMaps.
- apiGroups: [""]
  resources: ["services", "serviceaccounts", "configmaps"]
  verbs: ["get", "list", "watch", "create", "patch", "update", "delete"]
# Pool PodDisruptionBudgets.
- apiGroups: ["policy"]
  resources: ["poddisruptionbudgets"]
  verbs: ["get", "list", "watch", "create", "patch", "update", "delete"]
# The router's Role and RoleBinding (read pods for service discovery). Granting a Role requires holding its
# permissions, which the pods rule below provides; no escalate or bind verbs are needed.
- apiGroups: ["rbac.authorization.k8s.io"]
  resources: ["roles", "rolebindings"]
  verbs: ["get", "list", "watch", "create", "patch", "update", "delete"]
# Watch pool pods for readiness and crash reasons; patch the decode pods' pod-deletion-cost before a scale-down.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch", "patch"]
# In-cluster builds of the fixed serving image.
- apiGroups: ["batch"]
  resources: ["jobs"]
  verbs: ["get", "list", "watch", "create", "delete"]
# ServiceMonitors, rendered only when a SpecServing asks for them.
- apiGroups: ["monitoring.coreos.com"]
  resources: ["servicemonitors"]
  verbs: ["get", "list", "watch", "create", "patch", "update", "delete"]
# Events on transitions, for kubectl describe.
- apiGroups: ["", "events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch"]
{{- end -}}
