"""prfaas: Prefill-as-a-Service."""
