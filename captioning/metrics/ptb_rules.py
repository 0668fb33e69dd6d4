"""The rules of coco-caption's PTB tokenizer (CoreNLP 3.4.1's ``PTBLexer``) as Python regular expressions.

:data:`RULES` lists the JFlex scanner's rules that matter for English captions, in the grammar's order,
each as a compiled pattern and an action; :mod:`captioning.metrics.tokenizer` runs them with JFlex's
longest-match discipline and documents what they reproduce.  The rules mirror the macros of CoreNLP's
``PTBLexer.flex`` as they behave in version 3.4.1 (reconstructed from the grammar's published versions
and by probing the jar).  A rule's pattern has a group ``t``, the token text; whatever it matches after
that group is trailing context, which counts for the longest match but is scanned again.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable

__all__ = ["RULES", "Action", "SPACE"]


# ------------------------------------------------------------------------------------------------
# Character classes
# ------------------------------------------------------------------------------------------------
def _class_from(predicate: Callable[[str], bool]) -> str:
    """Regex character-class body for the BMP characters satisfying `predicate`, as ranges."""
    parts: list[str] = []
    start = None
    for cp in range(0x10001):  # one past the BMP closes the last range
        ok = cp < 0x10000 and not 0xD800 <= cp <= 0xDFFF and predicate(chr(cp))
        if ok and start is None:
            start = cp
        elif not ok and start is not None:
            lo, hi = re.escape(chr(start)), re.escape(chr(cp - 1))
            parts.append(lo if start == cp - 1 else f"{lo}-{hi}")
            start = None
    return "".join(parts)


# Characters the Java scanner treats as letters (they can start and continue a word), and characters
# it silently deletes when they appear on their own.  Both tables were derived by running
# stanford-corenlp-3.4.1.jar on every Basic Multilingual Plane character alone ("c") and inside a word
# ("zcz"), so they follow the jar's 2014 Unicode tables rather than Python's unicodedata.
_JAVA_LETTERS = (
    "\u00aa\u00b5\u00ba\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u037d\u0384-\u0386\u0388-\u038a\u038c\u038e-\u03a1"
    "\u03a3-\u0481\u0483-\u0487\u048a-\u0527\u0531-\u0556\u0559-\u055f\u0561-\u0587\u0591-\u05bd\u05bf"
    "\u05c1-\u05c2\u05c4-\u05c5\u05c7\u05d0-\u05ea\u05f0-\u05f2\u0615-\u061a\u0620-\u065e\u066e-\u06d3"
    "\u06d5-\u06ef\u06fa-\u06ff\u070f-\u07b1\u07ca-\u07f5\u07fa\u0800-\u0815\u081a\u0824\u0828\u0840-\u0858\u08a0"
    "\u08a2-\u08ac\u0900-\u0939\u093c-\u094e\u0950-\u0955\u0958-\u0963\u0971-\u0977\u0979-\u097f\u0981-\u0983"
    "\u0985-\u098c\u098f-\u0990\u0993-\u09a8\u09aa-\u09b0\u09b2\u09b6-\u09b9\u09bc-\u09c4\u09c7-\u09c8"
    "\u09cb-\u09ce\u09d7\u09dc-\u09dd\u09df-\u09e3\u09f0-\u09f1\u0a01-\u0a03\u0a05-\u0a0a\u0a0f-\u0a10"
    "\u0a13-\u0a28\u0a2a-\u0a30\u0a32-\u0a33\u0a35-\u0a36\u0a38-\u0a39\u0a3c\u0a3e-\u0a4f\u0a59-\u0a5c\u0a5e"
    "\u0a72-\u0a74\u0a81-\u0a83\u0a85-\u0a8d\u0a8f-\u0a91\u0a93-\u0aa8\u0aaa-\u0ab0\u0ab2-\u0ab3\u0ab5-\u0ab9"
    "\u0abc-\u0ad0\u0ae0-\u0ae1\u0b05-\u0b0c\u0b0f-\u0b10\u0b13-\u0b28\u0b2a-\u0b30\u0b32-\u0b33\u0b35-\u0b39"
    "\u0b3d\u0b5c-\u0b5d\u0b5f-\u0b61\u0b71\u0b82-\u0b83\u0b85-\u0b8a\u0b8e-\u0b90\u0b92-\u0b95\u0b99-\u0b9a"
    "\u0b9c\u0b9e-\u0b9f\u0ba3-\u0ba4\u0ba8-\u0baa\u0bae-\u0bb9\u0bbe-\u0bc2\u0bc6-\u0bc8\u0bca-\u0bcd\u0bd0"
    "\u0c01-\u0c03\u0c05-\u0c0c\u0c0e-\u0c10\u0c12-\u0c28\u0c2a-\u0c33\u0c35-\u0c39\u0c3d-\u0c56\u0c58-\u0c59"
    "\u0c60-\u0c61\u0c85-\u0c8c\u0c8e-\u0c90\u0c92-\u0ca8\u0caa-\u0cb3\u0cb5-\u0cb9\u0cbd\u0cde\u0ce0-\u0ce1"
    "\u0cf1-\u0cf2\u0d05-\u0d0c\u0d0e-\u0d10\u0d12-\u0d3a\u0d3d-\u0d44\u0d46-\u0d48\u0d4e\u0d60-\u0d61"
    "\u0d7a-\u0d7f\u0d85-\u0d96\u0d9a-\u0db1\u0db3-\u0dbb\u0dbd\u0dc0-\u0dc6\u0e01-\u0e3a\u0e40-\u0e4e"
    "\u0e81-\u0e82\u0e84\u0e87-\u0e88\u0e8a\u0e8d\u0e94-\u0e97\u0e99-\u0e9f\u0ea1-\u0ea3\u0ea5\u0ea7\u0eaa-\u0eab"
    "\u0ead-\u0ebd\u0ec0-\u0ec4\u0ec6\u0ec8-\u0ecd\u0edc-\u0edf\u0f00\u0f40-\u0f47\u0f49-\u0f6c\u0f88-\u0f8c"
    "\u1000-\u102a\u103f\u1050-\u1055\u105a-\u105d\u1061\u1065-\u1066\u106e-\u1070\u1075-\u1081\u108e"
    "\u10a0-\u10c5\u10c7\u10cd\u10d0-\u10fa\u10fc-\u1248\u124a-\u124d\u1250-\u1256\u1258\u125a-\u125d"
    "\u1260-\u1288\u128a-\u128d\u1290-\u12b0\u12b2-\u12b5\u12b8-\u12be\u12c0\u12c2-\u12c5\u12c8-\u12d6"
    "\u12d8-\u1310\u1312-\u1315\u1318-\u135a\u1380-\u138f\u13a0-\u13f4\u1401-\u166c\u166f-\u167f\u1681-\u169a"
    "\u16a0-\u16ea\u1700-\u170c\u170e-\u1711\u1720-\u1731\u1740-\u1751\u1760-\u176c\u176e-\u1770\u1780-\u17b3"
    "\u17d7\u17dc\u1820-\u1877\u1880-\u18a8\u18aa\u18b0-\u18f5\u1900-\u191c\u1950-\u196d\u1970-\u1974"
    "\u1980-\u19ab\u19c1-\u19c7\u1a00-\u1a16\u1a20-\u1a54\u1aa7\u1b05-\u1b33\u1b45-\u1b4b\u1b83-\u1ba0"
    "\u1bae-\u1baf\u1bba-\u1be5\u1c00-\u1c23\u1c4d-\u1c4f\u1c5a-\u1c7d\u1ce9-\u1cec\u1cee-\u1cf1\u1cf5-\u1cf6"
    "\u1d00-\u1dbf\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d\u1f50-\u1f57\u1f59\u1f5b\u1f5d"
    "\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb"
    "\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc\u2071\u207f\u2090-\u209c\u2102\u2107\u210a-\u2113\u2115\u2119-\u211d"
    "\u2124\u2126\u2128\u212a-\u212d\u212f-\u2139\u213c-\u213f\u2145-\u2149\u214e\u2183-\u2184\u2c00-\u2c2e"
    "\u2c30-\u2c5e\u2c60-\u2ce4\u2ceb-\u2cee\u2cf2-\u2cf3\u2d00-\u2d25\u2d27\u2d2d\u2d30-\u2d67\u2d6f"
    "\u2d80-\u2d96\u2da0-\u2da6\u2da8-\u2dae\u2db0-\u2db6\u2db8-\u2dbe\u2dc0-\u2dc6\u2dc8-\u2dce\u2dd0-\u2dd6"
    "\u2dd8-\u2dde\u2e2f\u3005-\u3006\u3031-\u3035\u303b-\u303c\u3041-\u3096\u309d-\u309f\u30a1-\u30fa"
    "\u30fc-\u30ff\u3105-\u312d\u3131-\u318e\u31a0-\u31ba\u31f0-\u31ff\u3400-\u4db5\u4e00-\u9fcc\ua000-\ua48c"
    "\ua4d0-\ua4fd\ua500-\ua60c\ua610-\ua61f\ua62a-\ua62b\ua640-\ua66e\ua67f-\ua697\ua6a0-\ua6e5\ua717-\ua71f"
    "\ua722-\ua788\ua78b-\ua78e\ua790-\ua793\ua7a0-\ua7aa\ua7f8-\ua801\ua803-\ua805\ua807-\ua80a\ua80c-\ua822"
    "\ua840-\ua873\ua882-\ua8b3\ua8f2-\ua8f7\ua8fb\ua90a-\ua925\ua930-\ua946\ua960-\ua97c\ua984-\ua9b2\ua9cf"
    "\uaa00-\uaa28\uaa40-\uaa42\uaa44-\uaa4b\uaa60-\uaa76\uaa7a\uaa80-\uaaaf\uaab1\uaab5-\uaab6\uaab9-\uaabd"
    "\uaac0\uaac2\uaadb-\uaadd\uaae0-\uaaea\uaaf2-\uaaf4\uab01-\uab06\uab09-\uab0e\uab11-\uab16\uab20-\uab26"
    "\uab28-\uab2e\uabc0-\uabe2\uac00-\ud7a3\ud7b0-\ud7c6\ud7cb-\ud7fb\uf900-\ufa6d\ufa70-\ufad9\ufb00-\ufb06"
    "\ufb13-\ufb17\ufb1d\ufb1f-\ufb28\ufb2a-\ufb36\ufb38-\ufb3c\ufb3e\ufb40-\ufb41\ufb43-\ufb44\ufb46-\ufbb1"
    "\ufbd3-\ufd3d\ufd50-\ufd8f\ufd92-\ufdc7\ufdf0-\ufdfb\ufe70-\ufe74\ufe76-\ufefc\uff21-\uff3a\uff41-\uff5a"
    "\uff66-\uffbe\uffc2-\uffc7\uffca-\uffcf\uffd2-\uffd7\uffda-\uffdc"
)

_JAVA_DELETED = (
    "\u0081-\u0084\u0086-\u0090\u0095\u0098-\u00a0\u037f-\u0383\u038b\u038d\u03a2\u0482\u0488-\u0489\u0528-\u0530"
    "\u0557-\u0558\u0560\u0588\u058a-\u0590\u05c8-\u05cf\u05eb-\u05ef\u05f5-\u05ff\u0604-\u0605\u060d-\u0613"
    "\u061c-\u061d\u065f\u066b-\u066c\u070e\u07b2-\u07bf\u07f9\u07fb-\u07ff\u0816-\u0819\u081b-\u0823"
    "\u0825-\u0827\u0829-\u083f\u0859-\u089f\u08a1\u08ad-\u08ff\u093a-\u093b\u094f\u0956-\u0957\u0970\u0978\u0980"
    "\u0984\u098d-\u098e\u0991-\u0992\u09a9\u09b1\u09b3-\u09b5\u09ba-\u09bb\u09c5-\u09c6\u09c9-\u09ca"
    "\u09cf-\u09d6\u09d8-\u09db\u09de\u09e4-\u09e5\u09f2-\u0a00\u0a04\u0a0b-\u0a0e\u0a11-\u0a12\u0a29\u0a31\u0a34"
    "\u0a37\u0a3a-\u0a3b\u0a3d\u0a50-\u0a58\u0a5d\u0a5f-\u0a65\u0a70-\u0a71\u0a75-\u0a80\u0a84\u0a8e\u0a92\u0aa9"
    "\u0ab1\u0ab4\u0aba-\u0abb\u0ad1-\u0adf\u0ae2-\u0ae5\u0af0-\u0b04\u0b0d-\u0b0e\u0b11-\u0b12\u0b29\u0b31\u0b34"
    "\u0b3a-\u0b3c\u0b3e-\u0b5b\u0b5e\u0b62-\u0b65\u0b70\u0b72-\u0b81\u0b84\u0b8b-\u0b8d\u0b91\u0b96-\u0b98\u0b9b"
    "\u0b9d\u0ba0-\u0ba2\u0ba5-\u0ba7\u0bab-\u0bad\u0bba-\u0bbd\u0bc3-\u0bc5\u0bc9\u0bce-\u0bcf\u0bd1-\u0be5"
    "\u0bf0-\u0c00\u0c04\u0c0d\u0c11\u0c29\u0c34\u0c3a-\u0c3c\u0c57\u0c5a-\u0c5f\u0c62-\u0c65\u0c70-\u0c84\u0c8d"
    "\u0c91\u0ca9\u0cb4\u0cba-\u0cbc\u0cbe-\u0cdd\u0cdf\u0ce2-\u0ce5\u0cf0\u0cf3-\u0d04\u0d0d\u0d11\u0d3b-\u0d3c"
    "\u0d45\u0d49-\u0d4d\u0d4f-\u0d5f\u0d62-\u0d65\u0d70-\u0d79\u0d80-\u0d84\u0d97-\u0d99\u0db2\u0dbc"
    "\u0dbe-\u0dbf\u0dc7-\u0e00\u0e3b-\u0e3e\u0e5a-\u0e80\u0e83\u0e85-\u0e86\u0e89\u0e8b-\u0e8c\u0e8e-\u0e93"
    "\u0e98\u0ea0\u0ea4\u0ea6\u0ea8-\u0ea9\u0eac\u0ebe-\u0ebf\u0ec5\u0ec7\u0ece-\u0ecf\u0eda-\u0edb\u0ee0-\u0eff"
    "\u0f01-\u0f1f\u0f2a-\u0f3f\u0f48\u0f6d-\u0f87\u0f8d-\u0fff\u102b-\u103e\u104a-\u104f\u1056-\u1059"
    "\u105e-\u1060\u1062-\u1064\u1067-\u106d\u1071-\u1074\u1082-\u108d\u108f\u109a-\u109f\u10c6\u10c8-\u10cc"
    "\u10ce-\u10cf\u10fb\u1249\u124e-\u124f\u1257\u1259\u125e-\u125f\u1289\u128e-\u128f\u12b1\u12b6-\u12b7\u12bf"
    "\u12c1\u12c6-\u12c7\u12d7\u1311\u1316-\u1317\u135b-\u137f\u1390-\u139f\u13f5-\u1400\u166d-\u166e\u1680"
    "\u169b-\u169f\u16eb-\u16ff\u170d\u1712-\u171f\u1732-\u173f\u1752-\u175f\u176d\u1771-\u177f\u17b4-\u17d6"
    "\u17d8-\u17db\u17dd-\u17df\u17ea-\u180f\u181a-\u181f\u1878-\u187f\u18a9\u18ab-\u18af\u18f6-\u18ff"
    "\u191d-\u1945\u196e-\u196f\u1975-\u197f\u19ac-\u19c0\u19c8-\u19cf\u19da-\u19ff\u1a17-\u1a1f\u1a55-\u1a7f"
    "\u1a8a-\u1a8f\u1a9a-\u1aa6\u1aa8-\u1b04\u1b34-\u1b44\u1b4c-\u1b4f\u1b5a-\u1b82\u1ba1-\u1bad\u1be6-\u1bff"
    "\u1c24-\u1c3f\u1c4a-\u1c4c\u1c7e-\u1ce8\u1ced\u1cf2-\u1cf4\u1cf7-\u1cff\u1dc0-\u1dff\u1f16-\u1f17"
    "\u1f1e-\u1f1f\u1f46-\u1f47\u1f4e-\u1f4f\u1f58\u1f5a\u1f5c\u1f5e\u1f7e-\u1f7f\u1fb5\u1fbf-\u1fc1\u1fc5"
    "\u1fcd-\u1fcf\u1fd4-\u1fd5\u1fdc-\u1fdf\u1fed-\u1ff1\u1ff5\u1ffd-\u2012\u2024-\u2025\u2027\u202a-\u202f"
    "\u203c-\u203d\u2043\u2045-\u206f\u2072-\u2073\u208f\u209d-\u209f\u20a1-\u20a3\u20a5-\u20ab\u20ad-\u20ff"
    "\u2150-\u2152\u215f-\u2182\u2185-\u218f\u2c2f\u2c5f\u2ce5-\u2cea\u2cef-\u2cf1\u2cf4-\u2cff\u2d26"
    "\u2d28-\u2d2c\u2d2e-\u2d2f\u2d68-\u2d6e\u2d70-\u2d7f\u2d97-\u2d9f\u2da7\u2daf\u2db7\u2dbf\u2dc7\u2dcf\u2dd7"
    "\u2ddf-\u2e2e\u2e30-\u3000\u3003-\u3004\u3007-\u3011\u3013-\u3030\u3036-\u303a\u303d-\u3040\u3097-\u309c"
    "\u30a0\u3100-\u3104\u312e-\u3130\u318f-\u319f\u31bb-\u31ef\u3200-\u33ff\u4db6-\u4dff\u9fcd-\u9fff"
    "\ua48d-\ua4cf\ua4fe-\ua4ff\ua60d-\ua60f\ua62c-\ua63f\ua66f-\ua67e\ua698-\ua69f\ua6e6-\ua716\ua720-\ua721"
    "\ua789-\ua78a\ua78f\ua794-\ua79f\ua7ab-\ua7f7\ua802\ua806\ua80b\ua823-\ua83f\ua874-\ua881\ua8b4-\ua8cf"
    "\ua8da-\ua8f1\ua8f8-\ua8fa\ua8fc-\ua8ff\ua926-\ua92f\ua947-\ua95f\ua97d-\ua983\ua9b3-\ua9ce\ua9da-\ua9ff"
    "\uaa29-\uaa3f\uaa43\uaa4c-\uaa4f\uaa5a-\uaa5f\uaa77-\uaa79\uaa7b-\uaa7f\uaab0\uaab2-\uaab4\uaab7-\uaab8"
    "\uaabe-\uaabf\uaac1\uaac3-\uaada\uaade-\uaadf\uaaeb-\uaaf1\uaaf5-\uab00\uab07-\uab08\uab0f-\uab10"
    "\uab17-\uab1f\uab27\uab2f-\uabbf\uabe3-\uabef\uabfa-\uabff\ud7a4-\ud7af\ud7c7-\ud7ca\ud7fc-\ud7ff"
    "\ue000-\uf8ff\ufa6e-\ufa6f\ufada-\ufaff\ufb07-\ufb12\ufb18-\ufb1c\ufb1e\ufb29\ufb37\ufb3d\ufb3f\ufb42\ufb45"
    "\ufbb2-\ufbd2\ufd3e-\ufd4f\ufd90-\ufd91\ufdc8-\ufdef\ufdfc-\ufe6f\ufe75\ufefd-\uff00\uffbf-\uffc1"
    "\uffc8-\uffc9\uffd0-\uffd1\uffd8-\uffd9\uffdd-\uffdf\uffe2-\uffe4\uffe7-\uffff"
)

_LCH = "A-Za-z\u00ad" + _JAVA_LETTERS  # the soft hyphen may sit inside words; it is removed from them
_DELETED = re.compile(f"[{_JAVA_DELETED}]")
_DCH = _class_from(lambda ch: unicodedata.category(ch) == "Nd" and not _DELETED.match(ch))
_LETTER_RX = re.compile(f"[{_LCH}]")
# Java's [:letter:] (Character.isLetter): the scanner's LETTER without its extra marks and symbols.
_JLCH = "A-Za-z" + _class_from(lambda ch: ord(ch) > 0x7F and ch.isalpha() and bool(_LETTER_RX.match(ch)))
_ALPHA = f"[{_LCH}]"          # one LETTER (word character)
_JALPHA = f"[{_JLCH}]"        # one [:letter:]
_DIGIT = f"[{_DCH}]"          # one decimal digit
_ALNUM = f"[{_JLCH}{_DCH}]"   # [:letter:] or [:digit:]

_SP = "[ \t\u00a0\u2000-\u200a\u3000]"       # spaces
SPACE = _SP  # one space character, as the scanner sees it
_NL = "(?:\r\n?|[\n\u2028\u2029\u000b\u000c])"  # line breaks (only "\n" survives clean_caption)
_SPNL = f"(?:{_SP}|{_NL})"
_APOS = "(?:['\u0092\u2019]|&apos;)"
_APOSETC = "(?:['\u0092\u2019`\u0091\u2018\u201b]|&apos;)"
_SPLET = "&[aeiouAEIOU](?i:acute|grave|uml);"
_LETTER = f"(?:{_ALPHA}|{_SPLET})"
_WORD = f"{_LETTER}(?:{_LETTER}|{_DIGIT})*(?:[.!?]{_LETTER}(?:{_LETTER}|{_DIGIT})*)*"
_REDAUX = f"{_APOS}(?:[msdMSD]|(?i:re|ve|ll))"
_SWORD = "[A-Za-z\u00ad]*[A-MO-Za-mo-z]\u00ad*"
_SREDAUX = f"(?i:n){_APOSETC}(?i:t)"
_NUMSEP = "[.:,\u00ad\u066b\u066c]"
# (Python alternation is ordered, not longest-match: every pattern lists its longer alternatives first.)
_NUM = f"(?:{_DIGIT}+(?:{_NUMSEP}{_DIGIT}+)*|(?:{_NUMSEP}{_DIGIT}+)+)"
_NUMBER = f"[-+]?{_NUM}"
_HYPHEN = "[-_\u058a\u2010\u2011]"
_ACRO = "(?:[A-Za-z](?:\\.[A-Za-z])+|(?i:(?:canada|sino|korean|eu|japan|non)-u\\.s|u\\.s\\.-(?:u\\.k|u\\.s\\.s\\.r)))"
_SGML_NAME = "[A-Za-z][A-Za-z0-9_:.-]*"
_SGML_VALUE = "(?:'[^\\r\\n']*'|\"[^\\r\\n\"]*\")"
_SGML = (f"<(?:[!?][A-Za-z-][^>\\r\\n]*|/?{_SGML_NAME}"
         f"(?: +(?:{_SGML_NAME} *= *{_SGML_VALUE}|{_SGML_NAME}|{_SGML_VALUE}| */))* */?)>")

# Abbreviations (the scanner is case-insensitive except inside character classes such as "[A]rk").
_ABMONTH = "(?i:jan|feb|mar|apr|jun|jul|aug|sep|sept|oct|nov|dec)"
_ABDAYS = "(?i:mon|tue|tues|wed|thu|thurs|fri)"
_ABSTATE = ("(?:(?i:ala|ariz)|A(?i:z)|A(?i:rk)|(?i:calif|colo|conn|ct|dak)|D(?i:el)|(?i:fla|ga)|I(?i:ll)"
            "|(?i:ind|kans?|ky)|L(?i:a)|M(?i:ass)|(?i:md|mich|minn)|M(?i:iss)|(?i:mo|mont|neb|nev|okla)|O(?i:re)"
            "|P(?i:a)|(?i:penn|tenn)|T(?i:ex)|(?i:va|vt)|W(?i:ash)|(?i:wisc?|wyo))")
_ABCOMP = "(?i:inc|cos?|corp|pp?tys?|ltd|plc|rt|bancorp|dept|bhd|assn|univ|intl|sys)"
_ABNUM = "(?i:tel|est|ext|sq)"
# Abbreviations recognised only before a number ("No. 5", "fig. 3").
_ABBREV3 = "(?i:ca|figs?|prop|nos?|art|bldg|pp|op)\\."
_ABPTIT = "(?i:jr|sr|bros|(?:ed|ph)\\.d|blvd|rd|esq)"
_ABBREV1 = f"(?:{_ABPTIT}|{_ABMONTH}|{_ABDAYS}|{_ABSTATE}|{_ABCOMP}|{_ABNUM}|(?i:etc|al|seq))\\."
_ABTITLE = ("(?:(?i:mr|mrs|ms)|M(?i:iss)|(?i:drs?|profs?|sens?|reps?|attys?|lt|col|gen|messrs|govs?|adm|rev|maj|sgt"
            "|cpl|pvt|mt|ft|capt|ste?|ave|pres|lieut|hon|brig|co?mdr|pfc|spc|supts?|det))")
_ABCOMP2 = "(?i:invt|elec|natl|m[ft]g)"
_ABBREV4 = f"(?:{_ACRO}|(?i:a\\.k\\.a)|{_ABTITLE}|(?i:vs|alex|wm|jos|cie|cf|treas|ph)|{_ABCOMP2}|[A-Za-z])"
_SENTEND = f"{_SPNL}(?:{_SPNL}|[A-Z]|{_SGML})"
_INSENTP = "[,;:]"
_ACRONYM_NEXT = ("(?:A(?i:bout|ccording|dditionally|fter|n|s|t)|A|B(?i:ut)|E(?i:arlier)|H(?i:e|er|ere|owever)"
                 "|I(?i:f|n|t)|L(?i:ast)|M(?i:any|ore|r\\.|s\\.)|N(?i:ow)|O(?i:nce|ne|ther|ur)"
                 "|S(?i:he|ince|o|ome|uch)|T(?i:hat|he|hen|here|hese|hey|his)|W(?i:e|hen|hile|hat)|Y(?i:et|ou)"
                 f"|{_SGML})")

# APOWORD: words with an apostrophe inside that stay one token; one pattern per alternative so that
# the longest one wins, as in JFlex.
_APOWORDS = (f"{_APOS}(?i:n){_APOS}?", f"[lLdDjJ]{_APOS}", f"(?i:dunkin|somethin|ol){_APOS}", f"{_APOS}(?i:em)",
             f"[A-HJ-XZn]{_APOSETC}{_JALPHA}{{2,}}", f"{_APOS}[2-9]0(?i:s)", f"{_APOS}(?i:till?)",
             f"{_JALPHA}+[aeiouyAEIOUY]{_APOSETC}[aeiouA-Z]{_JALPHA}*", f"{_APOS}(?i:cause)",
             "(?i:cont'd\\.?|nor'easter|c'mon|e'er|s'mores|ev'ry|li'l|nat'l)", f"(?i:o){_APOSETC}(?i:o)")
_FILENAME = (f"{_ALNUM}+(?:\\.{_ALNUM}+)*\\.(?i:bat|bmp|bz2|c|class|cgi|cpp|dll|doc|docx|exe|gif|gz|h|htm"
             "|html|jar|java|jpeg|jpg|mov|mp3|pdf|php|pl|png|ppt|ps|py|sql|tar|txt|wav|x|xml|zip|3gp|wm[va]|avi"
             "|flv|mp[34g])")
_FULLURL = "(?i:https?)://[^ \t\n\f\r\"<>|(){}]+[^ \t\n\f\r\"<>|.!?(){},-]"
_URLPATH = "(?:/[^ \t\n\f\r\"<>|()]+[^ \t\n\f\r\"<>|.!?(){},-])?"
_LIKELYURLS = (f"(?i:www)\\.(?:[^ \t\n\f\r\"<>|.!?(){{}},]+\\.)+[a-zA-Z]{{2,4}}{_URLPATH}",
               # ",-_" is a character range in the original pattern, kept as such
               f"(?:[^ \t\n\f\r\"`'<>|.!?(){{}},-_$]+\\.)+(?i:com|net|org|edu){_URLPATH}")
_SMILEY = "[<>]?[:;=][-o*']?[()DPdpO\\\\{@|\\[\\]]"
_ASIANSMILEY = ("[-^x=~<>']_[-^x=~<>']|\\([-^x=~<>'][_.]?[-^x=~<>']\\)|\\([\\^x=~<>']-[\\^x=~<>'`]\\)")
_EMAIL = ("(?:&lt;|<)?[a-zA-Z0-9][^ \t\n\f\r\"<>|(){}\u00a0]*@"
          "(?:[^ \t\n\f\r\"<>|(){}.\u00a0]+\\.)*[^ \t\n\f\r\"<>|(){}.\u00a0]+(?:&gt;|>)?")
_PHONE = ("(?:\\([0-9]{2,3}\\)[ \u00a0]?|(?:\\+\\+?)?(?:[0-9]{2,4}[- \u00a0])?[0-9]{2,4}[- \u00a0])"
          "[0-9]{3,4}[- \u00a0]?[0-9]{3,5}"
          "|(?:(?:\\+\\+?)?[0-9]{2,4}\\.)?[0-9]{2,4}\\.[0-9]{3,4}\\.[0-9]{3,5}")
_FRAC = f"(?:{_DIGIT}{{1,4}}[- \u00a0])?{_DIGIT}{{1,4}}(?:\\\\?/|\u2044){_DIGIT}{{1,4}}"
_THING = (f"(?:[dDoOlL]{_APOSETC}{_ALNUM})?{_ALNUM}+"
          f"(?:{_HYPHEN}(?:[dDoOlL]{_APOSETC}{_ALNUM})?{_ALNUM}+)*")
_THINGA = "[A-Z]+(?:(?:[+&]|(?i:&amp;))[A-Z]+)+"
_THING3 = "[A-Za-z0-9]+(?:-[A-Za-z]+){0,2}(?:\\\\?/[A-Za-z0-9]+(?:-[A-Za-z]+){0,2}){1,2}"
_HTHING = f"[A-Za-z0-9][A-Za-z0-9.,\u00ad]*(?:-(?:{_ACRO}\\.|[A-Za-z0-9\u00ad]+))+"

# ------------------------------------------------------------------------------------------------
# Token normalisations
# ------------------------------------------------------------------------------------------------
_FRACTIONS = {"\u00bc": "1/4", "\u00bd": "1/2", "\u00be": "3/4", "\u2153": "1/3", "\u2154": "2/3"}
_CURRENCY = str.maketrans({"\u00a2": "cents", "\u00a3": "#", "\u0080": "$", "\u00a4": "$", "\u20a0": "$",
                           "\u20ac": "$"})
_LEFT_SINGLE = re.compile("[\u0091\u2018\u201b\u2039]")
_RIGHT_SINGLE = re.compile("[\u0092\u2019\u203a]")
_LEFT_DOUBLE = re.compile("[\u0093\u201c\u00ab]")
_RIGHT_DOUBLE = re.compile("[\u0094\u201d\u00bb]")


def _latex_quotes(tok: str, probably_left: bool) -> str:
    """The scanner's default quote normalisation (``latexQuotes``)."""
    if probably_left:
        tok = re.sub("&apos;|'", "`", tok)
        tok = re.sub('"|&quot;', "``", tok)
    else:
        tok = re.sub("&apos;|'", "'", tok)
        tok = re.sub('"|&quot;', "''", tok)
    tok = _LEFT_SINGLE.sub("`", tok)
    tok = _RIGHT_SINGLE.sub("'", tok)
    tok = _LEFT_DOUBLE.sub("``", tok)
    return _RIGHT_DOUBLE.sub("''", tok)


def _amp(tok: str) -> str:
    return re.sub("(?i:&amp;)", "&", tok)


def _soft(tok: str) -> str:
    return tok.replace("\u00ad", "")


Action = Callable[[str], tuple[list[str], int]]


def _emit(norm: Callable[[str], str] = lambda t: t) -> Action:
    return lambda t: ([norm(t)], len(t))


def _push_back(n: int) -> Action:
    """Emit all but the last `n` characters and scan those again (JFlex's ``yypushback``)."""
    return lambda t: ([t[:-n]], len(t) - n)


def _reduplicate(t: str) -> tuple[list[str], int]:
    """Abbreviation ending a sentence: emit it whole, then scan its final period again."""
    return [t], len(t) - 1


def _acronym_end(t: str) -> tuple[list[str], int]:
    """Acronym before a sentence-initial word: "U.S. The" -> "U.S." "." ...; but "I. The" -> "I" "."."""
    if len(t) == 2:
        return [t[0]], 1
    return [t], len(t) - 1


def _const(out: str) -> Action:
    return lambda t: ([out], len(t))


def _skip(t: str) -> tuple[list[str], int]:
    return [], len(t)


def _newline(t: str) -> tuple[list[str], int]:
    return ["\n"], len(t)


def _other(t: str) -> tuple[list[str], int]:
    """Any other single character: kept as a token unless the Java scanner deletes it."""
    if ord(t) > 0xFFFF or _DELETED.match(t):
        return [], 1
    return [t], 1


# Each rule: (pattern, action).  The pattern's group "t" is the token text; anything matched after it
# is trailing context, which counts for the longest match but is scanned again.
_RULE_SPECS: list[tuple[str, Action]] = [
    ("(?P<t>(?i:c\\+\\+|[cf]#))", _emit()),
    ("(?P<t>(?i:cannot|'twas))", _push_back(3)),
    (f"(?P<t>{_APOS}(?i:tis)|(?i:gonna|gotta|lemme|gimme|wanna))", _push_back(2)),
    (f"(?P<t>{_SGML})", _emit(lambda t: t.replace(" ", "\u00a0"))),
    ("(?P<t>&(?:MD|mdash|ndash);|[\u0096\u0097\u2013\u2014\u2015])", _const("--")),
    ("(?P<t>(?i:&amp;))", _const("&")),
    ("(?P<t>&(?:HT|TL|UR|LR|QC|QL|QR|odq|cdq|#[0-9]+);)", _emit()),
    (f"(?P<t>{_WORD})(?={_REDAUX})(?P<c>{_REDAUX})", _emit(_soft)),
    (f"(?P<t>{_SWORD})(?P<c>{_SREDAUX})", _emit(_soft)),
    (f"(?P<t>{_WORD})", _emit(lambda t: _soft(t) or "-")),  # a lone soft hyphen comes out as "-"
    *[(f"(?P<t>{p})", _emit()) for p in _APOWORDS],
    (f"(?P<t>(?i:y){_APOS})(?P<c>{_JALPHA})", _emit()),
    (f"(?P<t>{_FULLURL})", _emit()),
    *[(f"(?P<t>{p})", _emit()) for p in _LIKELYURLS],
    (f"(?P<t>{_EMAIL})", _emit()),
    (f"(?P<t>@[a-zA-Z_][a-zA-Z_0-9]*|#{_ALPHA}+)", _emit()),
    (f"(?P<t>{_REDAUX})(?P<c>[^A-Za-z])", _emit(lambda t: _latex_quotes(t, False))),
    (f"(?P<t>{_SREDAUX})", _emit(lambda t: _latex_quotes(t, False))),
    (f"(?P<t>{_DIGIT}{{1,2}}[-/]{_DIGIT}{{1,2}}[-/]{_DIGIT}{{2,4}})", _emit()),
    (f"(?P<t>{_NUMBER})", _emit(_soft)),
    ("(?P<t>[\u207a\u207b\u208a\u208b]?(?:[\u2070\u00b9\u00b2\u00b3\u2074-\u2079]+|[\u2080-\u2089]+))", _emit()),
    (f"(?P<t>{_FRAC})", _emit(lambda t: t.replace(" ", "\u00a0"))),
    ("(?P<t>[\u00bc\u00bd\u00be\u2153-\u215e])", _emit(lambda t: _FRACTIONS.get(t, t))),
    (f"(?P<t>(?i:-(?:rrb|lrb|rcb|lcb|rsb|lsb)-|c\\.d\\.s|pro-|anti-|s(?:&|&amp;)p-500|s(?:&|&amp;)ls"
     f"|cap{_APOS}n|c{_APOS}est))", _emit(_amp)),
    (f"(?P<t>{_THING3})", _emit()),
    ("(?P<t>[A-Z]*\\$|#)", _emit()),
    ("(?P<t>[\u00a2\u00a3\u00a4\u00a5\u0080\u20a0\u20ac\u060b\u0e3f\u20a4\uffe0\uffe1\uffe5\uffe6])",
     _emit(lambda t: t.translate(_CURRENCY))),
    (f"(?P<t>[A-Za-z](?:\\.[A-Za-z])*\\.)(?P<c>{_SPNL}+{_ACRONYM_NEXT}{_SPNL})", _acronym_end),
    (f"(?P<t>{_ABBREV3})(?P<c>{_SPNL}?{_DIGIT})", _emit()),
    (f"(?P<t>{_ABBREV1})(?P<c>{_SENTEND})", _reduplicate),
    (f"(?P<t>{_ABBREV1})(?P<c>[\\s\\S]{{2}})", _emit()),
    (f"(?P<t>{_ABBREV1})", _reduplicate),  # only at the very end of the input
    (f"(?P<t>{_ABBREV4}\\.)", _emit()),
    (f"(?P<t>{_ABBREV4})(?P<c>{_SP})", _emit()),
    (f"(?P<t>{_ACRO})(?P<c>{_SPNL})", _emit()),
    (f"(?P<t>{_APOS}[0-9][0-9])(?P<c>{_SPNL})", _emit()),
    (f"(?P<t>{_FILENAME})(?P<c>{_SPNL}|[.?!,\"'<])", _emit()),
    (f"(?P<t>{_WORD}\\.)(?P<c>{_INSENTP})", _emit(_soft)),
    (f"(?P<t>{_PHONE})", _emit(lambda t: t.replace(" ", "\u00a0").replace("(", "-LRB-").replace(")", "-RRB-"))),
    ('(?P<t>"|&quot;)(?P<c>[A-Za-z0-9$])', _emit(lambda t: _latex_quotes(t, True))),
    ('(?P<t>"|&quot;)', _emit(lambda t: _latex_quotes(t, False))),
    (f"(?P<t>{_SMILEY})(?![A-Za-z0-9])", _emit(lambda t: t.replace("(", "-LRB-").replace(")", "-RRB-"))),
    (f"(?P<t>{_ASIANSMILEY})", _emit(lambda t: t.replace("(", "-LRB-").replace(")", "-RRB-"))),
    ("(?P<t><<|>>)", _emit()),
    ("(?P<t>[+%&\u2030\u2031~^|\\\\<>])", _emit()),
    ("(?P<t>\\[)", _const("-LSB-")),
    ("(?P<t>\\])", _const("-RSB-")),
    ("(?P<t>\\{)", _const("-LCB-")),
    ("(?P<t>\\})", _const("-RCB-")),
    ("(?P<t>\\()", _const("-LRB-")),
    ("(?P<t>\\))", _const("-RRB-")),
    ("(?P<t>-+)", lambda t: (["--" if 3 <= len(t) <= 4 else t], len(t))),
    ("(?P<t>\\.{3,5}|(?:\\.[ \u00a0]){2,4}\\.|[\u0085\u2026])", _const("...")),
    ("(?P<t>@+|#+|_+)", _emit()),
    ("(?P<t>\\*+|(?:\\\\\\*){1,3})", _emit()),
    (f"(?P<t>{_INSENTP})", _emit()),
    ("(?P<t>[?!]+)", _emit()),
    ("(?P<t>[.\u00a1\u00bf\u037e\u0589\u061f\u06d4\u0700-\u0702\u07fa])", _emit()),
    ("(?P<t>=)", _emit()),
    ("(?P<t>/)", _emit()),
    (f"(?P<t>{_HTHING}\\.)(?P<c>{_INSENTP})", _emit(_soft)),
    (f"(?P<t>{_HTHING})", _emit(_soft)),
    (f"(?P<t>{_THING}\\.)(?P<c>{_INSENTP})", _emit()),
    (f"(?P<t>{_THING})", _emit()),
    (f"(?P<t>{_THINGA}\\.)(?P<c>{_INSENTP})", _emit(_amp)),
    (f"(?P<t>{_THINGA})", _emit(_amp)),
    ("(?P<t>')(?P<c>[A-Za-z][^ \t\n\r\u00a0])", _emit(lambda t: _latex_quotes(t, True))),
    (f"(?P<t>{_REDAUX})", _emit(lambda t: _latex_quotes(t, False))),
    (f"(?P<t>''|[`\u2018\u2019\u201a\u201b\u201c\u201d\u0091\u0092\u0093\u0094\u201e\u201f\u2039\u203a"
     f"\u00ab\u00bb]{{1,2}}|{_APOS})", _emit(lambda t: _latex_quotes(t, False))),
    (f"(?P<t>\x00|{_SP}+|[\u200b\u200e\u200f\ufeff])", _skip),
    (f"(?P<t>{_NL})", _newline),
    ("(?P<t>&nbsp;)", _skip),
    ("(?P<t>[\\s\\S])", _other),
]

RULES: list[tuple[re.Pattern[str], Action]] = [(re.compile(p), a) for p, a in _RULE_SPECS]
