"""The HTTP server's rules, plain code (no vLLM import): the RL routes the API key
guards (`rl_routes`), what their bodies may hold (`rl_route_bodies`) and the checks of a
`collective_rpc` call (`rpc_check`). The route patches and what they share are in
`patches/http/`."""
