"""Text from elsewhere made safe to print: what a worker host, a learner or a peer sends may
come from someone hostile, and a terminal acts on the escape sequences it is sent."""


def printable(text: str) -> str:
    """`text` with every character a terminal could act on (escape sequences, carriage returns,
    line ends, other control and format characters) replaced by '?'."""
    return "".join(char if char.isprintable() else "?" for char in text)
