from torchvision import Missing


def __getattr__(name: str) -> Missing:
    return Missing("transforms." + name)
