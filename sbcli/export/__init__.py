"""Ways out of sbcli: ONNX (``onnx``), the Hugging Face Hub (``hub``, ``card``) and serving (``serve``).

Nothing is imported here: ``onnx``/``onnxruntime`` and ``huggingface_hub`` are optional extras
(``pip install "sbcli[onnx,hub]"``), loaded only by the function that needs them.
"""
