"""Images in prompts, for vision-language models: the model's image processor, placeholders, limits."""
