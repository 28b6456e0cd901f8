"""The benchmark database: the FlashInfer Trace data model, the on-disk Dataset, input
synthesis and reference execution."""

from flashtune.data.dataset import Dataset
from flashtune.data.io import DatasetFileError, LoadError
from flashtune.data.models import (
    DTYPES,
    BuildSpec,
    ConstAxis,
    Correctness,
    Definition,
    Evaluation,
    EvaluationStatus,
    Performance,
    RandomInput,
    SafetensorsInput,
    ScalarInput,
    Solution,
    SourceFile,
    TensorSpec,
    Trace,
    VarAxis,
    Workload,
)
from flashtune.data.reference import compile_reference, outputs_as_dict, run_reference
from flashtune.data.synth import (
    ConstraintError,
    check_constraints,
    resolve_axes,
    small_workload,
    synthesize_inputs,
    torch_dtype,
)

__all__ = [
    "DTYPES",
    "BuildSpec",
    "ConstAxis",
    "ConstraintError",
    "Correctness",
    "Dataset",
    "DatasetFileError",
    "Definition",
    "Evaluation",
    "EvaluationStatus",
    "LoadError",
    "Performance",
    "RandomInput",
    "SafetensorsInput",
    "ScalarInput",
    "Solution",
    "SourceFile",
    "TensorSpec",
    "Trace",
    "VarAxis",
    "Workload",
    "check_constraints",
    "compile_reference",
    "outputs_as_dict",
    "resolve_axes",
    "run_reference",
    "small_workload",
    "synthesize_inputs",
    "torch_dtype",
]
