"""What a command refuses before it does anything: said in one line, naming the options as they are typed."""


class OptionRefused(ValueError):
    """Options that make no sense together, or have no effect as given; the message names them as typed."""
