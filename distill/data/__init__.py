from distill.data.module import RolloutDataModule
from distill.data.prompts import PromptCollator

__all__ = ["PromptCollator", "RolloutDataModule"]
