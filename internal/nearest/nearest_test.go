package nearest

import "testing"

func TestName(t *testing.T) {
	known := []string{"GRPC_CLIENT_TLS_CACERT", "GRPC_SERVER_TLS_CA_CERT", "GRPC_CLIENT_TLS_SAN", "tls_ca_file", "drip_batch"}
	for _, c := range []struct {
		in   string
		want string
		d    int
	}{
		{"GRPC_CLIENT_TLS_CA_CERT", "GRPC_CLIENT_TLS_CACERT", 1},
		{"GRPC_CLIENT_TLS_SANS", "GRPC_CLIENT_TLS_SAN", 1},
		{"grpc_server_tls_ca_cert", "GRPC_SERVER_TLS_CA_CERT", 0},
		{"tls_ca_flie", "tls_ca_file", 2},
		{"drip_bach", "drip_batch", 1},
	} {
		if got, d := Name(c.in, known); got != c.want || d != c.d {
			t.Errorf("Name(%q) = %q, %d; want %q, %d", c.in, got, d, c.want, c.d)
		}
	}
	if got, d := Name("x", nil); got != "" || d != -1 {
		t.Errorf("Name with nothing known: %q, %d", got, d)
	}
}

func TestDistance(t *testing.T) {
	for _, c := range []struct {
		a, b string
		d    int
	}{{"", "", 0}, {"abc", "", 3}, {"kitten", "sitting", 3}, {"flaw", "lawn", 2}} {
		if d := Distance(c.a, c.b); d != c.d || Distance(c.b, c.a) != c.d {
			t.Errorf("Distance(%q, %q) = %d, want %d", c.a, c.b, d, c.d)
		}
	}
	long := string(make([]byte, 100))
	if d := Distance(long, "a"); d < 99 {
		t.Errorf("Distance of a 100-byte name: %d, want 99 or more", d)
	}
}
