-- 0012: a message carries the trace it was written in.
--
-- When a span is recording at enqueue or publish, the library stores its W3C
-- trace context ({"traceparent": ..., "tracestate": ...}) with the message, and
-- the dispatcher starts each delivery attempt's span as its child, so the
-- business request, the enqueue and every attempt form one trace. NULL when
-- nothing was traced. The history (delivered) does not keep it: a delivered
-- message's trace is in the tracing backend, and its trace id in the
-- dispatcher's log lines.
ALTER TABLE messages ADD COLUMN trace_context jsonb;
