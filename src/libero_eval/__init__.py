"""Evaluate SGLang-served robot action policies on LIBERO; knows nothing of Snakemake."""
