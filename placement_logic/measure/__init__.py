"""Measurement: plans run on real PyTorch distributed, compared with the predictions.

Input: an ``ir.Spec`` and plan names. Output: ``MeasureReport``s (``session.measure``).
The package imports torch only inside launched ranks (``worker``, ``torch_plan``,
``counter``, ``model``, all under ``ranks``); ``shape``, ``realise``, ``predict``,
``compare`` (with ``mechanisms``, ``collective_rows`` and ``tensor_axis``), ``report``, ``render`` and
``session`` are torch-free.
"""
