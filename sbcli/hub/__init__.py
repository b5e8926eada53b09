"""The Hugging Face Hub and the zoo: push, pull, model cards, pretrained backbones."""
