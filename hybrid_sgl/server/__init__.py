"""HTTP server: SGLang's native API and the OpenAI-compatible API around one Engine, reached only
through its public methods (prepare / submit / abort, stats, capacity, grammar_ready, flush_cache,
server_info) and its configuration (server_args, model_config, tokenizer).

    app.py                 create_app(engine): routes, error handlers, API-key check
    native.py              /generate, /health, /get_model_info, /server_info, /flush_cache, /metrics, ...
    openai_completions.py  /v1/completions
    openai_chat.py         /v1/chat/completions
    openai_common.py       shared OpenAI pieces (sampling, submit, answer and stream, usage, logprobs)
                           and /v1/models
    generation.py          runs prepared requests for one HTTP request, aborting on disconnect
    protocol.py            request bodies (strict pydantic models)
    errors.py              OpenAI-format errors for every route
    metrics.py             Prometheus text
"""
