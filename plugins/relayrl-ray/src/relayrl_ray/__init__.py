"""relayrl-ray: the ``ray`` launcher (``relayrl run CONFIG --launcher ray``)."""
