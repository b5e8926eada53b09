"""`sb serve`: an HTTP (and gRPC) server for exported ONNX files, learner directories and Triton model repositories."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Optional

import typer

from sbcli.cli import paths
from sbcli.cli._errors import friendly_errors
from sbcli.cli.console import plain

NET, BATCH, GPU = "Network", "Batching and limits", "GPU (onnxruntime-gpu)"

EPILOG = """Examples:

  sb serve model.onnx --port 8000

  curl -F image=@photo.jpg http://127.0.0.1:8000/predict           # top-k labels with probabilities

  sb serve my-learner --workers 2 --provider cpu                      # every kept step is a version; reloads

  sb serve model_repository --grpc-port 8001                          # every model of a Triton repository, HTTP and gRPC

  sb serve a.onnx my-learner                                          # two models: /predict?model=a, /v2/models/my-learner

  sb serve model.onnx --provider tensorrt --trt-fp16 --trt-cache /var/cache/trt   # on a machine with a GPU

Routes: POST /predict (multipart files, JSON {"images": \\[base64, ...]} or a raw image body; ?top_k=N;
?model=NAME when several models are served), GET /health, GET /metadata; the Open Inference Protocol
(KServe v2): GET /v2/health/live, GET /v2/health/ready, GET /v2, GET /v2/models,
GET /v2/models/NAME\\[/versions/STEP]\\[/ready|/config|/stats], POST .../infer, GET /v2/models/stats,
POST /v2/repository/index, POST /v2/repository/models/NAME/load|unload (only with --model-control-mode
explicit, as Triton); GET /metrics (Prometheus, with Triton's nv_inference_* names), also alone on
--metrics-port (8002). With --grpc-port, the same protocol over gRPC (Triton's inference.GRPCInferenceService).

Limits: a request over --max-request-mb is 413; past --max-inflight-mb of bodies held by all requests
together (a body parsed into images or tensors, multipart, JSON or /v2 infer, counts twice) a request is 503 at once;
a request whose head has not arrived within --header-timeout seconds, or whose body has not within
--request-timeout, is 408 and closed; past --max-connections (or --max-connections-per-client from one
address) the connection idle longest is closed to make room, or the new one is 503 when all are serving; past --max-queue requests waiting for the
batcher a request is 503 at once. Every error is JSON: {"error": "one sentence"}.
"""


@friendly_errors
def serve(
    models: Annotated[list[Path], typer.Argument(help="What to serve, one or more: .onnx files written by `sb export`, learner directories (each kept step exported to a cached ONNX file, one version each), Triton model folders, or a Triton model repository from `sb export --format triton` (every model in it). Each is served by its name: the file's stem or the folder's name.", show_default=False)],
    host: Annotated[str, typer.Option("--host", help="Address to listen on (0.0.0.0: every interface).", rich_help_panel=NET)] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="Port to listen on.", rich_help_panel=NET)] = 8000,
    workers: Annotated[int, typer.Option("--workers", help="Server processes sharing the port, each with its own model (at most the CPU cores).", rich_help_panel=NET)] = 1,
    grpc_port: Annotated[Optional[int], typer.Option("--grpc-port", help="Also serve the Open Inference Protocol over gRPC on this port (Triton's is 8001); needs the grpc extra. Default: off.", rich_help_panel=NET, show_default=False)] = None,
    metrics_port: Annotated[int, typer.Option("--metrics-port", help="Also answer GET /metrics, and nothing else, on this port, as Triton does on 8002 (GET /metrics on --port stays); 0: off.", rich_help_panel=NET)] = 8002,
    model_control_mode: Annotated[str, typer.Option("--model-control-mode", help="Triton's model control: none refuses a client's load and unload requests (400); explicit lets any client that reaches the server load and unload models.", rich_help_panel=NET)] = "none",
    provider: Annotated[str, typer.Option("--provider", help="auto (TensorRT, then CUDA, then CPU, among those that load), cpu, cuda or tensorrt.")] = "auto",
    threads: Annotated[Optional[int], typer.Option("--threads", help="onnxruntime threads per model call, at most the CPU cores (default: its own choice).", show_default=False)] = None,
    top_k: Annotated[int, typer.Option("--top-k", "-k", help="Labels per image when a request does not say.")] = 5,
    max_batch_size: Annotated[int, typer.Option("--max-batch-size", help="Most images scored in one model call.", rich_help_panel=BATCH)] = 32,
    max_wait_ms: Annotated[float, typer.Option("--max-wait-ms", help="Longest wait for more images to fill a batch (at most 60000).", rich_help_panel=BATCH)] = 5.0,
    max_request_mb: Annotated[float, typer.Option("--max-request-mb", help="Larger requests are refused (413) before they are read whole (at most 1024).", rich_help_panel=BATCH)] = 16.0,
    max_inflight_mb: Annotated[Optional[float], typer.Option("--max-inflight-mb", help="The most request bytes held at once by all requests together (a multipart, JSON or /v2 infer body counts twice: its parsed copy); past it a request is refused at once (503, Retry-After). Default: 4 x --max-request-mb.", rich_help_panel=BATCH, show_default=False)] = None,
    request_timeout: Annotated[float, typer.Option("--request-timeout", help="Seconds for a request's head, then for its body, to arrive; a slower one is answered 408 and its connection closed (between 0.01 and 3600).", rich_help_panel=NET)] = 60.0,
    max_connections: Annotated[Optional[int], typer.Option("--max-connections", help="Connections open at once per worker; one more closes the connection idle longest (no request being served), or is answered 503 and closed when all are serving. Default: 512, fewer where the open-file limit (ulimit -n) leaves less room.", rich_help_panel=NET, show_default=False)] = None,
    max_connections_per_client: Annotated[Optional[int], typer.Option("--max-connections-per-client", help="Connections one client address may hold at once per worker (the same rule past it, among its own). Default: 64, at most --max-connections.", rich_help_panel=NET, show_default=False)] = None,
    header_timeout: Annotated[float, typer.Option("--header-timeout", help="Seconds for a request head to arrive on a new or kept-alive connection (at most --request-timeout); a half-sent one is 408 and closed.", rich_help_panel=NET)] = 10.0,
    max_images: Annotated[int, typer.Option("--max-images", help="Most images in one request.", rich_help_panel=BATCH)] = 64,
    max_queue: Annotated[int, typer.Option("--max-queue", help="Most requests waiting for the batcher at once (every model together); one more is refused at once (503, Retry-After).", rich_help_panel=BATCH)] = 128,
    cuda_graph: Annotated[bool, typer.Option("--cuda-graph", help="CUDA graphs on the CUDA provider (needs --provider cuda): one captured graph per batch size bucket.", rich_help_panel=GPU)] = False,
    trt_fp16: Annotated[bool, typer.Option("--trt-fp16", help="Let TensorRT use fp16 kernels (--provider tensorrt or auto).", rich_help_panel=GPU)] = False,
    trt_cache: Annotated[Optional[Path], typer.Option("--trt-cache", help="Folder for TensorRT's engines and timing cache (default: tensorrt in the serve cache).", rich_help_panel=GPU, show_default=False)] = None,
    max_image_megapixels: Annotated[float, typer.Option("--max-image-megapixels", help="An image that would decode to more pixels is refused (413), read from its header before decoding; JPEGs decode at a reduced scale first, so only their reduced size counts.", rich_help_panel=BATCH)] = 40.0,
    max_request_megapixels: Annotated[float, typer.Option("--max-request-megapixels", help="The most pixels one request may decode (413 beyond), and the most decoded at once by all requests together: it bounds the server's decoding memory (about 4 bytes a pixel).", rich_help_panel=BATCH)] = 120.0,
    cache_dir: Annotated[Optional[Path], typer.Option("--cache-dir", help="Where learner directories are exported for serving (and TensorRT's engines kept); the same as setting SBCLI_SERVE_CACHE. Default: ~/.cache/sbcli/serve, or a folder of your own in the temporary folder when that is read-only (a container's root file system).", show_default=False)] = None,
    reload_interval: Annotated[float, typer.Option("--reload-interval", help="Seconds between checks for a changed model file or learner (0: never reload).", rich_help_panel=BATCH)] = 2.0,
) -> None:
    """Serve models over HTTP (and gRPC): /predict, /health, /metadata, the Open Inference Protocol (KServe v2) with Triton's repository, configuration and statistics, and /metrics, with dynamic batching and reload."""
    for model in models:
        paths.model(model, triton=True)  # before torch or onnxruntime loads: a mistyped path answers at once
    if cache_dir is not None:  # the exporter's child interpreters and every --workers process read it from there
        os.environ["SBCLI_SERVE_CACHE"] = str(cache_dir.expanduser().resolve())
    from sbcli.cli import render
    from sbcli.export.serving import EXPORTER
    from sbcli.serve.app import ServeConfig
    from sbcli.serve.server import MAX_REQUEST_MB, Listen, megabytes, megapixels, prepare, run

    inflight = None if max_inflight_mb is None else megabytes("--max-inflight-mb", max_inflight_mb)
    listen = Listen(host, port, workers, grpc_port=grpc_port)
    cfg = ServeConfig(tuple(map(str, models)), provider, top_k, max_batch_size, max_wait_ms,
                      megabytes("--max-request-mb", max_request_mb, MAX_REQUEST_MB), max_images, reload_interval, threads, cuda_graph,
                      trt_fp16, str(trt_cache) if trt_cache else None,
                      max_image_pixels=megapixels("--max-image-megapixels", max_image_megapixels),
                      max_request_pixels=megapixels("--max-request-megapixels", max_request_megapixels),
                      exporter=EXPORTER, max_inflight_bytes=inflight, request_timeout_s=request_timeout,
                      max_connections=max_connections, max_queue=max_queue, grpc_listen=listen.grpc_listen,
                      model_control_mode=model_control_mode, metrics_port=metrics_port, header_timeout_s=header_timeout,
                      max_connections_per_client=max_connections_per_client)
    server = prepare(cfg, listen)
    for served in server.models.served.values():
        meta = served.describe()
        render.ERR.print(f"Serving {plain(served.source)} as {plain(repr(served.name))} ({len(meta['classes'])} classes, input "
                         f"{meta['input_size']}, provider {meta['provider']})", highlight=False)
    render.ERR.print(f"on http://{plain(host)}:{port} with {workers} worker(s); batches of up to {max_batch_size} within "
                     f"{max_wait_ms:g} ms, at most {max_queue} requests waiting", highlight=False)
    names = list(server.models.served)
    where = f"/v2/models/{names[0]}" if len(names) == 1 else f"/v2/models/NAME (NAME: {', '.join(names)})"
    render.ERR.print(f"Open Inference Protocol (KServe v2) at http://{plain(host)}:{port}{plain(where)} (versions: the learners' "
                     "kept steps, default the latest); Prometheus metrics at /metrics"
                     + (f" and on port {metrics_port}" if metrics_port else "")
                     + (f"; gRPC at {plain(listen.grpc_listen)}" if grpc_port else "")
                     + ("; clients may load and unload models" if model_control_mode == "explicit" else ""),
                     highlight=False)
    run(server, listen)
