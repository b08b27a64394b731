"""``prfaas.integrations``: prfaas inside other serving engines (``vllm``: a KV connector).

Each subpackage owns the glue to one outside engine and imports that engine only where it must
(the class the engine loads); importing this package imports nothing outside prfaas.
"""
