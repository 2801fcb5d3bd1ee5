"""Runtime plumbing every layer above may use, and none of it about models or records.

`lazy` (PEP 562 exports), `event_loops` (one value per asyncio loop), `http_pool` (the
HTTP pools our clients share), `devices` (device and dtype rule), `heap` and `allocator`
(memory given back, tcmalloc), `watchdog` (child servers that die with their parent),
`names` (names that become folder names). Nothing here is public API: the names users
need are exported from `art_langgraph`.
"""
