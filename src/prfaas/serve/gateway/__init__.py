"""The gateway's back half: the node registry (control plane), the dispatcher that carries out the
policy's decisions on live nodes, and the app that puts them behind ``serve.api``."""
