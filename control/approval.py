"""An operator's approval of a replacement the fleet's budget withheld: the control key's signature of the request.

The budget (streams/remediation_budget.py) withholds replacements past its limit; a human who checked the node
approves one with `clocktower control approve NODE INCIDENT`. Only the control key (held by the streams and the
operator's CLI, never by a node) can sign an approval, so a node cannot approve its own drain, and a forged or
altered approval orders nothing. The signature covers every field of the request but `approval`.
"""

from __future__ import annotations

import base64
import binascii

import orjson
from cryptography.exceptions import InvalidSignature

from clocktower.control.signing import CommandSigner, CommandVerifier
from clocktower.schemas.control import ReplacementRequest

_DOMAIN = b"clocktower-approve\x00"   # an approval's signature can never pass for a command's


def approved_bytes(req: ReplacementRequest) -> bytes:
    return _DOMAIN + orjson.dumps(req.model_dump(exclude={"approval"}), option=orjson.OPT_SORT_KEYS)


def approve(signer: CommandSigner, req: ReplacementRequest) -> ReplacementRequest:
    """`req` with the control key's approval."""
    sig = base64.urlsafe_b64encode(signer.key.sign(approved_bytes(req))).rstrip(b"=").decode()
    return req.model_copy(update={"approval": sig})


def is_approved(verifier: CommandVerifier, req: ReplacementRequest) -> bool:
    """Whether `req.approval` is the control key's signature of exactly this request."""
    if len(req.approval) != 86:
        return False
    try:
        raw = base64.urlsafe_b64decode(req.approval + "==")
        if base64.urlsafe_b64encode(raw).rstrip(b"=").decode() != req.approval:
            return False            # the last character's spare bits: one signature, one spelling
        verifier.key.verify(raw, approved_bytes(req))
    except (InvalidSignature, binascii.Error, ValueError):
        return False
    return True
