package rules

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"math/big"
)

// maxKeyFile bounds what is read from a key or JWKS file.
const maxKeyFile = 1 << 20

func (e *Env) readKeyFile(path string) ([]byte, error) {
	b, err := e.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, errors.New("no such file")
	}
	if err != nil {
		var pe *fs.PathError
		if errors.As(err, &pe) {
			return nil, pe.Err
		}
		return nil, err
	}
	if len(b) > maxKeyFile {
		return nil, errors.New("larger than 1 MiB")
	}
	return b, nil
}

// readPEMKey reads an RSA, ECDSA or Ed25519 public key from a PEM file: a
// PUBLIC KEY (PKIX), an RSA PUBLIC KEY (PKCS #1) or a CERTIFICATE.
func (e *Env) readPEMKey(path string) (crypto.PublicKey, error) {
	b, err := e.readKeyFile(path)
	if err != nil {
		return nil, err
	}
	blk, _ := pem.Decode(b)
	if blk == nil {
		return nil, errors.New("no PEM block found")
	}
	var key any
	switch blk.Type {
	case "PUBLIC KEY":
		key, err = x509.ParsePKIXPublicKey(blk.Bytes)
	case "RSA PUBLIC KEY":
		key, err = x509.ParsePKCS1PublicKey(blk.Bytes)
	case "CERTIFICATE":
		var cert *x509.Certificate
		cert, err = x509.ParseCertificate(blk.Bytes)
		if err == nil {
			key = cert.PublicKey
		}
	default:
		return nil, fmt.Errorf("PEM block %q is not a public key (PUBLIC KEY, RSA PUBLIC KEY or CERTIFICATE)", blk.Type)
	}
	if err != nil {
		return nil, err
	}
	switch key.(type) {
	case *rsa.PublicKey, *ecdsa.PublicKey, ed25519.PublicKey:
		return key, nil
	}
	return nil, fmt.Errorf("unsupported key type %T (RSA, ECDSA or Ed25519)", key)
}

type jwk struct {
	Kty string `json:"kty"`
	Kid string `json:"kid"`
	Alg string `json:"alg"`
	Use string `json:"use"`
	N   string `json:"n"`
	E   string `json:"e"`
	Crv string `json:"crv"`
	X   string `json:"x"`
	Y   string `json:"y"`
}

// readJWKS reads the public keys of a JSON Web Key Set (RFC 7517): RSA,
// EC (P-256, P-384, P-521) and OKP (Ed25519). Keys marked for encryption
// ("use": "enc") are skipped; every bad key is reported.
func (e *Env) readJWKS(path string) ([]PublicKey, []error) {
	b, err := e.readKeyFile(path)
	if err != nil {
		return nil, []error{err}
	}
	var set struct {
		Keys []json.RawMessage `json:"keys"`
	}
	if err := json.Unmarshal(b, &set); err != nil {
		return nil, []error{fmt.Errorf("not a JWKS: %v", err)}
	}
	if len(set.Keys) == 0 {
		return nil, []error{errors.New("holds no keys")}
	}
	var keys []PublicKey
	var errs []error
	for i, raw := range set.Keys {
		var k jwk
		if err := json.Unmarshal(raw, &k); err != nil {
			errs = append(errs, fmt.Errorf("keys[%d]: %v", i, err))
			continue
		}
		if k.Use == "enc" {
			continue
		}
		pk, err := k.public()
		if err != nil {
			errs = append(errs, fmt.Errorf("keys[%d]: %v", i, err))
			continue
		}
		keys = append(keys, PublicKey{ID: k.Kid, Alg: k.Alg, Key: pk})
	}
	return keys, errs
}

func b64(field, s string) ([]byte, error) {
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil || len(b) == 0 {
		return nil, fmt.Errorf("%s is not base64url", field)
	}
	return b, nil
}

func (k jwk) public() (crypto.PublicKey, error) {
	switch k.Kty {
	case "RSA":
		n, err := b64("n", k.N)
		if err != nil {
			return nil, err
		}
		e, err := b64("e", k.E)
		if err != nil {
			return nil, err
		}
		if len(e) > 4 {
			return nil, errors.New("e is too large")
		}
		ei := int(new(big.Int).SetBytes(e).Int64())
		if ei < 3 || ei%2 == 0 {
			return nil, errors.New("e is not a usable RSA exponent")
		}
		pub := &rsa.PublicKey{N: new(big.Int).SetBytes(n), E: ei}
		if pub.N.BitLen() < 2048 {
			return nil, fmt.Errorf("RSA key of %d bits is too short (at least 2048)", pub.N.BitLen())
		}
		return pub, nil
	case "EC":
		var curve elliptic.Curve
		switch k.Crv {
		case "P-256":
			curve = elliptic.P256()
		case "P-384":
			curve = elliptic.P384()
		case "P-521":
			curve = elliptic.P521()
		default:
			return nil, fmt.Errorf("unsupported EC curve %q", k.Crv)
		}
		x, err := b64("x", k.X)
		if err != nil {
			return nil, err
		}
		y, err := b64("y", k.Y)
		if err != nil {
			return nil, err
		}
		size := (curve.Params().BitSize + 7) / 8
		if len(x) != size || len(y) != size {
			return nil, errors.New("x or y has the wrong length for the curve")
		}
		// Parse through the uncompressed point encoding, which checks that
		// the point is on the curve.
		point := append(append([]byte{4}, x...), y...)
		pub, err := ecdsa.ParseUncompressedPublicKey(curve, point)
		if err != nil {
			return nil, errors.New("the point is not on the curve")
		}
		return pub, nil
	case "OKP":
		if k.Crv != "Ed25519" {
			return nil, fmt.Errorf("unsupported OKP curve %q", k.Crv)
		}
		x, err := b64("x", k.X)
		if err != nil {
			return nil, err
		}
		if len(x) != ed25519.PublicKeySize {
			return nil, errors.New("x is not an Ed25519 public key")
		}
		return ed25519.PublicKey(x), nil
	case "":
		return nil, errors.New("kty is missing")
	}
	return nil, fmt.Errorf("unsupported kty %q (RSA, EC or OKP)", k.Kty)
}
