"""The benchmark database: the FlashInfer Trace data model, the on-disk Dataset, input
synthesis and reference execution."""

from flashtune.data.constraints import (
    CONSTRAINT_FUNCTIONS,
    ConstraintNotAllowed,
    check_constraint,
    evaluate_constraint,
)
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
    check_path_component,
)
from flashtune.data.reference import compile_reference, outputs_as_dict, run_reference
from flashtune.data.synth import (
    ConstraintError,
    InputError,
    check_constraints,
    resolve_axes,
    small_workload,
    synthesize_inputs,
    torch_dtype,
)

__all__ = [
    "CONSTRAINT_FUNCTIONS",
    "DTYPES",
    "BuildSpec",
    "ConstAxis",
    "ConstraintError",
    "ConstraintNotAllowed",
    "Correctness",
    "Dataset",
    "DatasetFileError",
    "Definition",
    "Evaluation",
    "EvaluationStatus",
    "InputError",
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
    "check_constraint",
    "check_constraints",
    "check_path_component",
    "compile_reference",
    "evaluate_constraint",
    "outputs_as_dict",
    "resolve_axes",
    "run_reference",
    "small_workload",
    "synthesize_inputs",
    "torch_dtype",
]
