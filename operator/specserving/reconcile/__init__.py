"""The reconciler: kopf handlers that turn a SpecServing into its children and report their state.

Layers, from the bottom up (only `handlers` imports kopf, only `specserving.kube` talks to the API):

- pure: `reasons` (condition types and reasons), `kinds` (child kinds), `observed` (summaries of children and
  pods), `drift` (does a child match its rendering; what to prune), `conditions`, `status` (status from
  observations), `costs` (pod-deletion-cost from a load signal), `plan` (validate, resolve image, render);
- `controller`: one converge function per SpecServing, run under a per-object lock;
- `handlers`: the kopf registry (create/update/resume, child and pod watches, indexes);
- `runner`: `specserving run`.
"""
