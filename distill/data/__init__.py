from distill.data.module import PromptCollator, RolloutDataModule

__all__ = ["PromptCollator", "RolloutDataModule"]
