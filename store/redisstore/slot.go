package redisstore

// Slot is the Redis Cluster hash slot of key: CRC16 (XMODEM) of the key's
// hash tag (the part between the first '{' and the next '}', when not
// empty) or of the whole key, modulo 16384.
func Slot(key string) uint16 {
	for i := 0; i < len(key); i++ {
		if key[i] == '{' {
			for j := i + 1; j < len(key); j++ {
				if key[j] == '}' {
					if j > i+1 {
						key = key[i+1 : j]
					}
					return crc16(key) % 16384
				}
			}
			break
		}
	}
	return crc16(key) % 16384
}

func crc16(s string) uint16 {
	var crc uint16
	for i := 0; i < len(s); i++ {
		crc ^= uint16(s[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc
}
