; placement-logic proof obligation: composition/breaks-CR07
; theorem: Composition
; breaking CR07 expert-reduction-groups is refuted
;   statement refuted: Expert parameters are reduced over the expert-data axes and non-expert ones over the whole data group, each with its own divisor.  [plan: expert gradients divided by the data axis only]
; the assertions are the NEGATION of the statement:
;   expected sat (witness exists)
(set-logic ALL)
(set-info :status sat)
(declare-fun size_x () Int)
(declare-fun size_y () Int)
(declare-fun size_microbatches () Int)
(declare-fun cr07_agree_x () Bool)
(declare-fun cr07_agree_y () Bool)
(declare-fun cr07_agree_microbatches () Bool)
(declare-fun cr07_c () Int)
(declare-fun cr07_N_own () Int)
(declare-fun cr07_N_x () Int)
(declare-fun cr07_N_y () Int)
(declare-fun cr07_N_microbatches () Int)
(declare-fun cr07_N_x_y () Int)
(declare-fun cr07_N_microbatches_x () Int)
(declare-fun cr07_N_microbatches_y () Int)
(declare-fun cr07_N_microbatches_x_y () Int)
(assert
 (>= size_x 1))
(assert
 (<= size_x 2))
(assert
 (>= size_y 1))
(assert
 (<= size_y 2))
(assert
 (>= size_microbatches 1))
(assert
 (<= size_microbatches 2))
(assert
 (let (($x20 (= size_x 1)))
 (=> $x20 cr07_agree_x)))
(assert
 (let (($x25 (= size_y 1)))
 (=> $x25 cr07_agree_y)))
(assert
 (let (($x28 (= size_microbatches 1)))
 (=> $x28 cr07_agree_microbatches)))
(assert
 (>= cr07_c 1))
(assert
 (let ((?x34 (* cr07_c 1)))
 (= cr07_N_own ?x34)))
(assert
 (= cr07_N_x (* cr07_c (* 1 (- size_x 1)))))
(assert
 (= cr07_N_y (* cr07_c (* 1 (- size_y 1)))))
(assert
 (= cr07_N_microbatches (* cr07_c (* 1 (- size_microbatches 1)))))
(assert
 (= cr07_N_x_y (* cr07_c (* (* 1 (- size_x 1)) (- size_y 1)))))
(assert
 (let ((?x37 (- size_x 1)))
 (let ((?x48 (* 1 (- size_microbatches 1))))
 (let ((?x56 (* ?x48 ?x37)))
 (= cr07_N_microbatches_x (* cr07_c ?x56))))))
(assert
 (let ((?x61 (* cr07_c (* (* 1 (- size_microbatches 1)) (- size_y 1)))))
 (= cr07_N_microbatches_y ?x61)))
(assert
 (let ((?x42 (- size_y 1)))
 (let ((?x37 (- size_x 1)))
 (let ((?x48 (* 1 (- size_microbatches 1))))
 (let ((?x56 (* ?x48 ?x37)))
 (= cr07_N_microbatches_x_y (* cr07_c (* ?x56 ?x42))))))))
(assert
 (let ((?x84 (to_real size_x)))
(let ((?x82 (to_real cr07_N_microbatches_x_y)))
(let ((?x80 (to_real cr07_N_microbatches_y)))
(let ((?x78 (to_real cr07_N_microbatches_x)))
(let ((?x76 (to_real cr07_N_x_y)))
(let ((?x74 (to_real cr07_N_microbatches)))
(let ((?x72 (to_real cr07_N_y)))
(let ((?x75 (+ (+ (+ (+ 0.0 (to_real cr07_N_own)) (to_real cr07_N_x)) ?x72) ?x74)))
(let ((?x83 (+ (+ (+ (+ ?x75 ?x76) ?x78) ?x80) ?x82)))
(let (($x89 (and (distinct (* (* (* 1.0 (to_real 1)) (to_real 1)) ?x83) (* ?x83 ?x84)) true)))
(or false $x89))))))))))))
(check-sat)
(exit)
