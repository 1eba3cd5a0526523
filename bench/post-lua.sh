# Sourced by the bench scripts: `post_lua BODY` prints a wrk script that POSTs the file BODY as
# JSON (an AdmissionReview); a caller may append its own `done` function.
post_lua() {
  cat <<LUA
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
local f = io.open("$1", "r")
wrk.body = f:read("*a")
f:close()
LUA
}
