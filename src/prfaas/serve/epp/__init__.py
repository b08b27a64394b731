"""``prfaas epp``: the router as an Endpoint Picker behind Envoy (the Gateway API Inference
Extension's Endpoint Picker Protocol over Envoy ``ext_proc``). ``picker`` decides with the
gateway's own ``AttemptPlanner`` over the gateway's own registry (fed by the nodes' heartbeats to
the control listener this process serves), ``protocol`` turns a decision into ext_proc messages,
``server`` runs the gRPC services beside the gateway's listeners. docs/kubernetes.md."""
