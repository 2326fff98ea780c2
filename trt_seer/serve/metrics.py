"""The server's Prometheus metrics (prometheus_client, one registry per server): requests by
endpoint and outcome, prompt and completion tokens, queue depth, batch occupancy, time to first
token and inter-token latency.

    metrics = ServeMetrics(batcher)
    metrics.finished("completions", "stop")
    body, content_type = metrics.render()
"""
from __future__ import annotations

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class ServeMetrics:
    """Counters, gauges and histograms of one server; the gauges read the batcher when scraped."""

    def __init__(self, batcher):
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = r = CollectorRegistry()
        self.requests = Counter("trt_seer_requests", "Requests answered, by endpoint and outcome "
                                "(a finish reason, or an HTTP status for refused ones)", ["endpoint", "outcome"], registry=r)
        self.prompt_tokens = Counter("trt_seer_prompt_tokens", "Prompt tokens of accepted requests", registry=r)
        self.completion_tokens = Counter("trt_seer_completion_tokens", "Generated tokens", registry=r)
        queue = Gauge("trt_seer_queue_depth", "Requests waiting for a slot", registry=r)
        queue.set_function(batcher.queue_depth)
        used = Gauge("trt_seer_slots_in_use", "Decoder rows (slots) holding a request", registry=r)
        used.set_function(batcher.in_use)
        slots = Gauge("trt_seer_slots", "Decoder rows (slots) in all", registry=r)
        slots.set(batcher.slots)
        occupancy = Gauge("trt_seer_batch_occupancy", "Slots in use / slots", registry=r)
        occupancy.set_function(lambda: batcher.in_use() / batcher.slots)
        self.ttft = Histogram("trt_seer_time_to_first_token_seconds", "From a request's arrival to its first token",
                              buckets=LATENCY_BUCKETS, registry=r)
        self.itl = Histogram("trt_seer_inter_token_latency_seconds", "Between consecutive tokens of a request",
                             buckets=LATENCY_BUCKETS, registry=r)

    def finished(self, endpoint: str, outcome: str) -> None:
        self.requests.labels(endpoint, outcome).inc()

    def render(self) -> tuple[bytes, str]:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return generate_latest(self.registry), CONTENT_TYPE_LATEST
