module github.com/driplimit/drip

go 1.26
