"""Graph analysis: categorized topological ordering, categories, tensor facts."""

from tflms.analysis.cto import Analysis, Category, TensorFacts, analyze_graph

__all__ = ["Analysis", "Category", "TensorFacts", "analyze_graph"]
