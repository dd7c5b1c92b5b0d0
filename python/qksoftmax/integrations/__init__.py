"""qksoftmax inside other libraries: each submodule imports its library only when imported itself.

    qksoftmax.integrations.transformers    an attention implementation for Hugging Face transformers
"""
