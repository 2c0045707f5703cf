-- post.lua's request on a new connection each time (a full TLS handshake per request).
dofile(os.getenv("BENCH_POST_LUA"))
wrk.headers["Connection"] = "close"
