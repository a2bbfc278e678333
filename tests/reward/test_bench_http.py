"""`zerobubble bench reward`'s HTTP-against-gRPC part runs end to end and reports both transports."""

from zerobubble.tooling.bench.reward_http import CLIENTS, bench_http_vs_grpc


def test_bench_http_vs_grpc_reports_both_transports():
    figures = bench_http_vs_grpc(items=16)
    for clients in CLIENTS:
        assert figures[f"grpc_items_per_s_{clients}_clients"] > 0
        assert figures[f"http_items_per_s_{clients}_clients"] > 0
        assert figures[f"http_vs_grpc_{clients}_clients"] > 0
