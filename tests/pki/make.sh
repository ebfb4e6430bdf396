#!/usr/bin/env bash
# Makes a throw-away certificate authority for the TLS tests, in the directory given:
#   ca.pem / ca.key            the CA (P-256, two days)
#   server.pem / server.key    for localhost and 127.0.0.1, signed by the CA
#   client.pem / client.key    a client certificate (CN weft-client), signed by the CA
#   rotated.pem / rotated.key  a second server certificate (CN localhost-rotated)
#   stranger.pem / stranger.key  a client certificate from another CA
set -euo pipefail
dir="$1"
mkdir -p "$dir"
cd "$dir"
ca() { # name subject
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
    -keyout "$1.key" -out "$1.pem" -subj "/CN=$2" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
}
leaf() { # name subject ca usage san
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
    -keyout "$1.key" -out "$1.csr" -subj "/CN=$2" 2>/dev/null
  printf 'basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=%s\n%s\n' "$4" "$5" > "$1.ext"
  openssl x509 -req -in "$1.csr" -CA "$3.pem" -CAkey "$3.key" -CAcreateserial -days 2 \
    -extfile "$1.ext" -out "$1.pem" 2>/dev/null
  rm -f "$1.csr" "$1.ext"
}
ca ca "weft test CA"
ca other-ca "another CA"
leaf server localhost ca serverAuth "subjectAltName=DNS:localhost,IP:127.0.0.1"
leaf rotated localhost-rotated ca serverAuth "subjectAltName=DNS:localhost,IP:127.0.0.1"
leaf client weft-client ca clientAuth ""
leaf stranger stranger other-ca clientAuth ""
