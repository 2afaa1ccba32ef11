"""The signer and verifier a service gets from its settings: the key files, loaded and checked, or a UserError."""

from __future__ import annotations

from pathlib import Path

from clocktower.control.keys import BadKeyFile, load_private_key, load_public_key
from clocktower.control.signing import CommandSigner, CommandVerifier
from clocktower.runtime.errors import UserError
from clocktower.runtime.private_file import read_public_file
from clocktower.runtime.settings import RuntimeSettings


def signer_from(settings: RuntimeSettings) -> CommandSigner:
    """The streams' (and the CLI's) signer: CLOCKTOWER_CONTROL_PRIVATE_KEY_FILE or the data dir's generated key."""
    pem, path = settings.control_private_key_pem()
    try:
        return CommandSigner(load_private_key(pem, str(path)))
    except BadKeyFile as exc:
        raise UserError(f"{exc}: point CLOCKTOWER_CONTROL_PRIVATE_KEY_FILE at an Ed25519 PEM key") from None


def verifier_from_file(path: Path) -> CommandVerifier:
    """An actuator's verifier: the controller's public key (PEM) in `path`."""
    try:
        return CommandVerifier(load_public_key(read_public_file(path), str(path)))
    except BadKeyFile as exc:
        raise UserError(str(exc)) from None
