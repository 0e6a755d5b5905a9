"""What a run leaves for its user: export (staged), the model card and summary, the Hub push, and trying the adapter."""
