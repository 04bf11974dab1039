"""Vision towers: image embeddings, from an image processor's patches, for a vision-language model's placeholders."""
